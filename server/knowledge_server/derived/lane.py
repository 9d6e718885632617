"""Skills lane search: FTS5/BM25 over the catalog stored in ``derived.sqlite``.

The query is always literal: it is split into Unicode ``\\w+`` tokens (stop words dropped
unless nothing else remains), each token becomes a quoted FTS5 phrase, and the phrases are
OR-ed, so no FTS syntax from the caller is ever interpreted. Name matches weigh most (BM25
column weights name 10, description 2, when_to_use 1); a query naming a skill exactly gets a
fixed boost. Uses and ``used_by`` are counted from ``skill_use`` rows whose session lies in the
caller's workspaces, in SQL. ``scope`` keeps the skills whose ``SKILL.md`` lies under one of the
caller's roots: a skill outside every workspace (``~/.claude/skills``) is the server owner's and
only an unrestricted caller sees it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from knowledge_server import fts
from knowledge_server.textlang import STOP_WORDS

from .store import DerivedStore, workspace_clause

MAX_QUERY_CHARS = 2000
MAX_TERMS = 32
USED_BY_LIMIT = 5
EXACT_NAME_BOOST = 100.0
_WORD = re.compile(r"\w+", re.UNICODE)
_W_NAME, _W_DESC, _W_WHEN = 10.0, 2.0, 1.0


class InvalidQuery(ValueError):
    """The query has no word characters or is longer than ``MAX_QUERY_CHARS``."""


@dataclass(slots=True)
class SkillHit:
    name: str
    path: str
    description: str
    when_to_use: str | None
    content_hash: str
    uses: int
    used_by: list[tuple[str, str]] = field(default_factory=list)  # (actor_id, episode_id)
    score: float = 0.0
    why: list[str] = field(default_factory=list)


def _terms(query: str) -> list[str]:
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidQuery(f"query longer than {MAX_QUERY_CHARS} characters")
    words = [w.lower() for w in _WORD.findall(query) if w.strip("_")]
    if not words:
        raise InvalidQuery("query has no word characters")
    # Stop words are dropped unless nothing else remains, as in the episodes lane: "where
    # is the config loaded" must not list every skill whose description says "the".
    content = [w for w in words if w not in STOP_WORDS] or words
    return list(dict.fromkeys(content))[:MAX_TERMS]


def fts_expression(query: str) -> str:
    """The literal FTS5 MATCH expression for ``query`` (quoted phrases, OR-ed)."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in _terms(query))


def _exact_names(query: str) -> list[str]:
    q = query.strip().lower().lstrip("/")
    cands = {q}
    cands.update(t.lower() for t in re.findall(r"[\w][\w:.-]*", query))
    return [c for c in cands if c]


def search_skills(
    store: DerivedStore,
    query: str,
    *,
    limit: int = 10,
    skills: Sequence[str] | None = None,
    actor_ids: Sequence[str] | None = None,
    workspaces: Sequence[str] | None = None,
    scope: Sequence[str] | None = None,
    used_by_limit: int = USED_BY_LIMIT,
) -> list[SkillHit]:
    """Skills matching ``query``, best first (score desc, then name).

    ``skills`` keeps only those names; ``actor_ids`` keeps skills used by those actors and
    counts only their uses; ``workspaces`` counts only uses from sessions under those roots
    (``None`` = no restriction, ``[]`` = no uses); ``scope`` keeps the skills whose path lies
    under one of those roots (``None`` = every skill, ``[]`` = none). Raises
    :class:`InvalidQuery` only.
    """
    expr = fts_expression(query)
    limit = max(0, int(limit))
    if limit == 0:
        return []
    conds: list[str] = []
    args: list[Any] = [expr]
    if skills is not None:
        names = list(dict.fromkeys(skills))
        if not names:
            return []
        conds.append(f"s.name IN ({','.join('?' * len(names))})")
        args.extend(names)
    within = workspace_clause("s.path", scope)
    if within is None:
        return []
    if within[0] != "1":
        conds.append(within[0])
        args.extend(within[1])
    use_cond, use_args = _use_filter(actor_ids, workspaces)
    if actor_ids is not None:
        conds.append(
            f"EXISTS (SELECT 1 FROM skill_use u JOIN session_actor sa ON sa.session_id = u.session_id "  # noqa: S608 - conditions made here of constants and placeholders, values bound
            f"WHERE u.skill = s.name AND {use_cond})"
        )
        args.extend(use_args)
    where = (" AND " + " AND ".join(conds)) if conds else ""
    exact = _exact_names(query)
    score, score_args = _score(store, _terms(query), within)
    sql = (
        "WITH m AS (SELECT rowid AS rid, "  # noqa: S608 - constant weights and placeholders, values bound
        f"-{score} AS sc FROM skill_fts WHERE skill_fts MATCH ?) "
        "SELECT s.name, s.path, s.description, s.when_to_use, s.content_hash, m.sc, "
        f"lower(s.name) IN ({','.join('?' * len(exact))}) AS ex "
        f"FROM m JOIN skill s ON s.rowid = m.rid WHERE 1{where} "
        f"ORDER BY (m.sc + (lower(s.name) IN ({','.join('?' * len(exact))})) * {EXACT_NAME_BOOST}) DESC, "
        "s.name LIMIT ?"
    )
    # Parameter order follows the placeholders: the score's, MATCH, the exact list in
    # SELECT, the filters, the exact list in ORDER BY, LIMIT.
    params = [*score_args, args[0], *exact, *args[1:], *exact, limit]
    rows = cast(
        list[tuple[str, str, str, str | None, str, float, int]],
        store.conn.execute(sql, params).fetchall(),
    )
    hits: list[SkillHit] = []
    for name, path, desc, when, chash, sc, ex in rows:
        value = float(sc) + (EXACT_NAME_BOOST if ex else 0.0)
        why = ["exact skill name"] if ex else []
        why.append("matched name/description/when_to_use (bm25)")
        uses, used_by = _uses(store, name, use_cond, use_args, used_by_limit)
        if uses:
            why.append(f"used {uses} time{'s' if uses != 1 else ''}")
        hits.append(SkillHit(name, path, desc, when, chash, uses, used_by, round(value, 6), why))
    return hits


def _score(
    store: DerivedStore, terms: Sequence[str], within: tuple[str, list[Any]]
) -> tuple[str, list[Any]]:
    """The skills' BM25 and its parameters. Scoped to some workspaces (``within`` not
    "1"), it is ``knowledge_bm25`` (fts.scoped_bm25: FTS5's formula) with the statistics
    of the skills in scope alone: their count, average length and how many hold each
    term. With FTS5's ``bm25()`` over every skill of every workspace, another workspace's
    catalog moved a skill's score and order. Catalogs are small: counted per search."""
    native: tuple[str, list[Any]] = f"bm25(skill_fts, {_W_NAME}, {_W_DESC}, {_W_WHEN})", []
    if within[0] == "1":
        return native
    cond, cond_args = within
    n, tokens = store.conn.execute(
        "SELECT count(*), coalesce(sum(knowledge_docsize(d.sz)), 0) FROM skill s"  # noqa: S608 - conditions made here of constants and placeholders, values bound
        f" CROSS JOIN skill_fts_docsize d ON d.id = s.rowid WHERE {cond}",
        cond_args,
    ).fetchall()[0]
    if not n:
        return native  # no skill in scope: nothing will match
    idf = []
    for t in terms:
        (hits,) = store.conn.execute(
            "SELECT count(*) FROM skill_fts CROSS JOIN skill s ON s.rowid = skill_fts.rowid"  # noqa: S608 - as above
            f" WHERE skill_fts MATCH ? AND {cond}",
            ['"' + t.replace('"', '""') + '"', *cond_args],
        ).fetchall()[0]
        idf.append(fts.bm25_idf(int(cast(int, n)), int(cast(int, hits))))
    return fts.scoped_score(
        "skill_fts", int(cast(int, n)), int(cast(int, tokens)), (_W_NAME, _W_DESC, _W_WHEN), idf
    )


def _use_filter(
    actor_ids: Sequence[str] | None, workspaces: Sequence[str] | None
) -> tuple[str, list[Any]]:
    parts: list[str] = []
    args: list[Any] = []
    if actor_ids is not None:
        ids = list(dict.fromkeys(actor_ids))
        if ids:
            parts.append(f"u.actor_id IN ({','.join('?' * len(ids))})")
            args.extend(ids)
        else:
            parts.append("0")
    ws = workspace_clause("sa.cwd", workspaces)
    if ws is None:
        parts.append("0")
    elif ws[0] != "1":
        parts.append(ws[0])
        args.extend(ws[1])
    return (" AND ".join(parts) if parts else "1"), args


def _uses(
    store: DerivedStore, name: str, cond: str, args: list[Any], used_by_limit: int
) -> tuple[int, list[tuple[str, str]]]:
    base = (
        "FROM skill_use u JOIN session_actor sa ON sa.session_id = u.session_id "
        f"WHERE u.skill = ? AND {cond}"
    )
    n = int(
        cast(int, store.conn.execute(f"SELECT COUNT(*) {base}", [name, *args]).fetchall()[0][0])
    )
    if not n or used_by_limit <= 0:
        return n, []
    # Most active actors first; for each its latest use as the evidence episode, among the
    # uses the caller may see (the same conditions: an actor's latest use in another
    # workspace is not evidence for this one).
    rows = store.conn.execute(
        "SELECT actor_id, k, episode_id FROM (SELECT u.actor_id AS actor_id,"  # noqa: S608 - conditions made here of constants and placeholders, values bound
        " u.episode_id AS episode_id, COUNT(*) OVER (PARTITION BY u.actor_id) AS k,"
        " ROW_NUMBER() OVER (PARTITION BY u.actor_id"
        " ORDER BY u.time DESC, u.session_id DESC, u.seq DESC) AS rn "
        f"{base}) WHERE rn = 1 ORDER BY k DESC, actor_id LIMIT ?",
        [name, *args, int(used_by_limit)],
    ).fetchall()
    return n, [(str(r[0]), str(r[2])) for r in rows]


__all__ = ["InvalidQuery", "SkillHit", "fts_expression", "search_skills"]
