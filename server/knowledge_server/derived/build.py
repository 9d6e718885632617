"""Rebuild the derived layer from the episodes store and the skill catalog.

Incremental: every session has a signature (its metadata, event count, last event time,
outcome and the actor it maps to); only sessions whose signature changed, plus removed
ones, are re-derived. Same episodes ``index_rev`` and same catalog fingerprint = no-op.
A catalog change re-derives every session, because slash commands only count as skill
uses when they name a catalog skill.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..episodes.model import EventMeta, SessionInfo
from ..episodes.store import EpisodeStore
from ..fts import compact
from .skills import Catalog, Skill, load_catalog, skill_name_from_path
from .store import DerivedStore, dumps, sidechain_actor_id

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
_NON_TURN = ("system", "summary", "reasoning")
# Rows derived per session: a rebuild clears them for the sessions it rebuilds.
_PER_SESSION_TABLES = (
    "actor_session",
    "session_actor",
    "sidechain_span",
    "failed_event",
    "skill_use",
    "build_state",
)


@dataclass(slots=True)
class RebuildReport:
    actors: int = 0
    skills: int = 0
    skill_uses: int = 0
    sessions_processed: int = 0
    index_rev: str = ""
    changed: bool = False
    problems: list[str] = field(default_factory=list)


def _iso(dt: datetime | None) -> str | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _root_of(s: SessionInfo, by_id: dict[str, SessionInfo]) -> str:
    """The top-level ancestor id (the parent id itself when the parent is not indexed)."""
    cur, seen = s, {s.session_id}
    while cur.parent_session_id:
        pid = cur.parent_session_id
        parent = by_id.get(pid)
        if parent is None or pid in seen:
            return pid
        seen.add(pid)
        cur = parent
    return cur.session_id


def session_actor(s: SessionInfo, by_id: dict[str, SessionInfo]) -> tuple[str, str, str, str]:
    """(actor_id, kind, name, root_session_id) of a whole session."""
    if not s.parent_session_id:
        return (
            f"actor:{s.harness}:root_session:{s.session_id}",
            "root_session",
            s.title or s.session_id,
            s.session_id,
        )
    root = _root_of(s, by_id)
    key = s.subagent_type or s.agent_id or s.session_id.rsplit("/", 1)[-1]
    return (
        f"actor:{s.harness}:subagent:{root}:{key}",
        "subagent",
        s.subagent_type or s.agent_id or key,
        root,
    )


def _norm_skill(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    n = name.strip().lstrip("/").strip()
    return n or None


def _catalog_name(name: str | None, catalog: dict[str, Skill]) -> str | None:
    """Exact catalog name, else the part after a plugin prefix (``plugin:skill``)."""
    if not name:
        return None
    if name in catalog:
        return name
    tail = name.rsplit(":", 1)[-1]
    return tail if tail in catalog else None


def detect_skill_uses(
    e: EventMeta, catalog: dict[str, Skill], paths: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """(skill name, via) for each real skill invocation carried by one event's metadata
    (``paths``: the catalog's ``by_path()``, every skill file, for a Read of one)."""
    out: list[tuple[str, str]] = []
    m = e.meta or {}
    tool = e.tool_name or (
        e.event_type.split("/", 1)[1] if e.event_type.startswith("tool_use/") else None
    )
    if e.event_type.startswith("tool_use/") and tool == "Skill":
        n = _norm_skill(m.get("skill") or m.get("command"))
        if n:
            out.append((_catalog_name(n, catalog) or n, "skill_tool"))
    elif n := _norm_skill(m.get("skill")):
        # Explicit marker (generic JSONL ``meta.skill``): trust it as written.
        out.append((_catalog_name(n, catalog) or n, "meta"))
    raw_cmd = m.get("slash_command")
    first = raw_cmd.split()[0] if isinstance(raw_cmd, str) and raw_cmd.split() else None
    cmd = _catalog_name(_norm_skill(first), catalog)
    if cmd:
        out.append((cmd, "slash_command"))
    if e.event_type.startswith("tool_use/") and tool == "Read":
        fp = m.get("file_path")
        if isinstance(fp, str):
            n = skill_name_from_path(fp, catalog, paths)
            if n:
                out.append((_catalog_name(n, catalog) or n, "read_skill_file"))
    return out


def _outcome_of(events: list[EventMeta]) -> str:
    """Episodes rule 2 applied to one actor's events (inline sidechains have no signal)."""
    for e in reversed(events):
        if e.event_type in _NON_TURN:
            continue
        if e.is_error:
            return "failure"
        if e.event_type == "assistant/message":
            return "success"
        return "unknown"
    return "unknown"


@dataclass(slots=True)
class _Rows:
    actor_session: list[tuple[Any, ...]] = field(default_factory=list)
    session_actor: list[tuple[Any, ...]] = field(default_factory=list)
    spans: list[tuple[Any, ...]] = field(default_factory=list)
    failed: list[tuple[Any, ...]] = field(default_factory=list)
    uses: list[tuple[Any, ...]] = field(default_factory=list)
    state: list[tuple[Any, ...]] = field(default_factory=list)


def _derive_session(
    s: SessionInfo,
    events: list[EventMeta],
    by_id: dict[str, SessionInfo],
    catalog: dict[str, Skill],
    paths: dict[str, str],
    signature: str,
    rows: _Rows,
) -> None:
    aid, kind, name, root = session_actor(s, by_id)
    rows.session_actor.append((s.session_id, aid, s.harness, s.cwd))
    main: list[EventMeta] = []
    side: dict[str, list[EventMeta]] = {}
    task_types = sorted(
        {str(e.meta["subagent_type"]) for e in events if e.meta.get("subagent_type")}
    )
    span: list[Any] | None = None
    for e in events:
        actor = aid
        if kind == "root_session" and e.meta.get("is_sidechain"):
            actor = sidechain_actor_id(s.harness, s.session_id, e.meta.get("agent_id"))
            side.setdefault(actor, []).append(e)
            if span is not None and span[3] == actor:
                span[2] = e.seq
            else:
                if span is not None:
                    rows.spans.append(tuple(span))
                span = [s.session_id, e.seq, e.seq, actor]
        else:
            main.append(e)
            if span is not None:
                rows.spans.append(tuple(span))
                span = None
        if e.is_error:
            rows.failed.append((s.session_id, e.seq, actor))
    if span is not None:
        rows.spans.append(tuple(span))

    def times(evs: list[EventMeta]) -> tuple[str | None, str | None]:
        ts = [e.time for e in evs if e.time is not None]
        if not ts:
            fallback = _iso(s.created_at)
            return fallback, _iso(s.last_event_at) or fallback
        return _iso(min(ts)), _iso(max(ts))

    first, last = times(main) if main or not side else (None, None)
    if first is None:
        first, last = _iso(s.created_at), _iso(s.last_event_at)
    rows.actor_session.append(
        (
            aid,
            s.session_id,
            len(main),
            s.outcome or "unknown",
            first,
            last,
            kind,
            name,
            s.harness,
            root,
            s.cwd,
        )
    )
    outcomes = {aid: s.outcome or "unknown"}
    for actor, evs in side.items():
        agent = evs[0].meta.get("agent_id")
        # One Task subagent_type in the session names the inline sidechain unambiguously.
        label = task_types[0] if len(task_types) == 1 else (agent or "sidechain")
        f, lt = times(evs)
        out = _outcome_of(evs)
        outcomes[actor] = out
        rows.actor_session.append(
            (
                actor,
                s.session_id,
                len(evs),
                out,
                f,
                lt,
                "subagent",
                str(label),
                s.harness,
                root,
                s.cwd,
            )
        )
    for e in events:
        actor = aid
        if kind == "root_session" and e.meta.get("is_sidechain"):
            actor = sidechain_actor_id(s.harness, s.session_id, e.meta.get("agent_id"))
        for skill, via in detect_skill_uses(e, catalog, paths):
            rows.uses.append(
                (actor, skill, e.id, s.session_id, e.seq, _iso(e.time), outcomes[actor], via)
            )
    rows.state.append((s.session_id, signature, max((e.seq for e in events), default=None)))


# Raised when what a session's derivation reads changes in a way its other inputs do not
# show, so every session is derived again once: 2, the episodes' names made plain (schema
# step 005_plain_names rewrites an event's agent type, which names an inline sidechain's
# actor, without changing its session's fields).
DERIVATION = 2


def _signature(s: SessionInfo, actor_id: str) -> str:
    return dumps(
        [
            DERIVATION,
            actor_id,
            s.harness,
            s.cwd,
            s.title,
            s.parent_session_id,
            s.agent_id,
            s.subagent_type,
            s.event_count,
            _iso(s.last_event_at),
            _iso(s.created_at),
            s.outcome,
            s.max_event_id,
        ]
    )


def _next_rev(ds: DerivedStore) -> str:
    counter = int(ds.get_meta("rev_counter") or "0") + 1
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"derived:{stamp}:{counter}"


def rebuild(
    episodes_store: EpisodeStore,
    derived_store: DerivedStore,
    catalog_roots: Sequence[str] | None,
    full: bool = False,
    progress_callback: ProgressCallback | None = None,
    *,
    catalog: Catalog | None = None,
) -> RebuildReport:
    """Bring ``derived.sqlite`` up to date; see the module docstring for the incremental rule."""
    ds = derived_store
    cat = catalog if catalog is not None else load_catalog(catalog_roots)
    report = RebuildReport(problems=[f"{p.path}: {p.reason}" for p in cat.problems])
    ep_rev = episodes_store.index_rev()
    fp = cat.fingerprint()
    if (
        not full
        and ds.is_built()
        and ds.get_meta("episodes_rev") == ep_rev
        and ds.get_meta("catalog_fp") == fp
    ):
        _fill_counts(ds, report)
        report.index_rev = ds.index_rev()
        return report

    names = cat.by_name()
    paths = cat.by_path()
    all_sessions = episodes_store.sessions()
    by_id = {s.session_id: s for s in all_sessions}
    # A session whose source file disappeared keeps its row with no events: it is gone.
    sessions = [s for s in all_sessions if s.event_count > 0]
    by_id_live = {s.session_id for s in sessions}
    catalog_changed = full or ds.get_meta("catalog_fp") != fp
    old = {r[0]: r[1] for r in ds.conn.execute("SELECT session_id, signature FROM build_state")}
    todo: list[tuple[SessionInfo, str]] = []
    for s in sessions:
        sig = _signature(s, session_actor(s, by_id)[0])
        if catalog_changed or old.get(s.session_id) != sig:
            todo.append((s, sig))
    removed = [sid for sid in old if sid not in by_id_live]

    rows = _Rows()
    total = len(todo)
    batch = 200
    for start in range(0, total, batch):
        chunk = todo[start : start + batch]
        per: dict[str, list[EventMeta]] = {s.session_id: [] for s, _ in chunk}
        for e in episodes_store.iter_events_meta([s.session_id for s, _ in chunk]):
            per[e.session_id].append(e)
        for s, sig in chunk:
            _derive_session(s, per[s.session_id], by_id, names, paths, sig, rows)
        if progress_callback is not None:
            progress_callback(min(start + batch, total), total)

    stale = [s.session_id for s, _ in todo] + removed
    rev = _next_rev(ds)
    with ds._lock, ds.conn:
        c = ds.conn.cursor()
        if full:
            for t in _PER_SESSION_TABLES:
                c.execute(f"DELETE FROM {t}")  # noqa: S608 - t is one of our table names
        else:
            for sid in stale:
                for t in _PER_SESSION_TABLES:
                    c.execute(f"DELETE FROM {t} WHERE session_id = ?", (sid,))  # noqa: S608 - likewise
        _write_actor_sessions(c, rows.actor_session)
        c.executemany(
            "INSERT OR REPLACE INTO session_actor VALUES (?, ?, ?, ?)", rows.session_actor
        )
        c.executemany("INSERT OR REPLACE INTO sidechain_span VALUES (?, ?, ?, ?)", rows.spans)
        c.executemany("INSERT OR REPLACE INTO failed_event VALUES (?, ?, ?)", rows.failed)
        c.executemany("INSERT OR IGNORE INTO skill_use VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows.uses)
        c.executemany("INSERT OR REPLACE INTO build_state VALUES (?, ?, ?)", rows.state)
        if catalog_changed:
            c.execute("DELETE FROM skill")
            c.execute("DELETE FROM skill_fts")
            for sk in cat.skills:
                c.execute(
                    "INSERT INTO skill VALUES (?, ?, ?, ?, ?)",
                    (sk.name, sk.path, sk.description, sk.when_to_use, sk.content_hash),
                )
                c.execute(
                    "INSERT INTO skill_fts (rowid, name, description, when_to_use) "
                    "SELECT rowid, ?, ?, ? FROM skill WHERE path = ?",
                    (_name_terms(sk.name), sk.description, sk.when_to_use or "", sk.path),
                )
            # The catalog was rewritten whole: one segment, without the deleted entries
            # every earlier catalog left behind (fts.compact).
            compact(ds.conn, "skill_fts", changed_rows=len(cat.skills), total_rows=len(cat.skills))
        _aggregate_actors(c)
        counter = rev.rsplit(":", 1)[1]
        for k, v in (
            ("index_rev", rev),
            ("rev_counter", counter),
            ("episodes_rev", ep_rev),
            ("catalog_fp", fp),
        ):
            c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (k, v))
    report.sessions_processed = total
    report.changed = True
    report.index_rev = rev
    _fill_counts(ds, report)
    log.info(
        "derived rebuild: sessions=%d removed=%d actors=%d skill_uses=%d rev=%s",
        total,
        len(removed),
        report.actors,
        report.skill_uses,
        rev,
    )
    return report


def _name_terms(name: str) -> str:
    """Index ``test-driven-development`` both as the whole name and as its words."""
    words = name.replace("-", " ").replace("_", " ").replace(":", " ")
    return f"{name} {words}" if words != name else name


def _write_actor_sessions(c: Any, rows: list[tuple[Any, ...]]) -> None:
    c.executemany(
        "INSERT OR REPLACE INTO actor_session (actor_id, session_id, event_count, outcome, first_seen, last_seen) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [r[:6] for r in rows],
    )
    # Static actor fields are kept on the actor row; new rows provide the latest values.
    c.execute(
        "CREATE TEMP TABLE IF NOT EXISTS actor_static (actor_id TEXT PRIMARY KEY, kind TEXT, name TEXT, "
        "harness TEXT, root_session_id TEXT, cwd TEXT)"
    )
    c.execute("DELETE FROM actor_static")
    c.executemany(
        "INSERT OR REPLACE INTO actor_static VALUES (?, ?, ?, ?, ?, ?)",
        [(r[0], r[6], r[7], r[8], r[9], r[10]) for r in rows],
    )


def _aggregate_actors(c: Any) -> None:
    """Recompute every actor row from ``actor_session`` (cheap: one GROUP BY)."""
    c.execute(
        "CREATE TEMP TABLE IF NOT EXISTS actor_prev AS SELECT actor_id, kind, name, harness, "
        "root_session_id, workspace_cwd FROM actor WHERE 0"
    )
    c.execute("DELETE FROM actor_prev")
    c.execute(
        "INSERT INTO actor_prev SELECT actor_id, kind, name, harness, root_session_id, workspace_cwd FROM actor"
    )
    c.execute("DELETE FROM actor")
    c.execute(
        "INSERT INTO actor (actor_id, kind, name, source, harness, root_session_id, session_count, "
        "event_count, success, failure, unknown, first_seen, last_seen, workspace_cwd) "
        "SELECT g.actor_id, COALESCE(st.kind, p.kind), COALESCE(st.name, p.name), 'harness', "
        "COALESCE(st.harness, p.harness), COALESCE(st.root_session_id, p.root_session_id), "
        "g.n, g.ev, g.ok, g.bad, g.unk, g.f, g.l, COALESCE(st.cwd, p.workspace_cwd) "
        "FROM (SELECT actor_id, COUNT(*) AS n, SUM(event_count) AS ev, "
        "SUM(outcome = 'success') AS ok, SUM(outcome = 'failure') AS bad, "
        "SUM(outcome NOT IN ('success', 'failure')) AS unk, MIN(first_seen) AS f, MAX(last_seen) AS l "
        "FROM actor_session GROUP BY actor_id) g "
        "LEFT JOIN actor_static st ON st.actor_id = g.actor_id "
        "LEFT JOIN actor_prev p ON p.actor_id = g.actor_id"
    )
    c.execute("DELETE FROM actor_static")
    c.execute("DELETE FROM actor_prev")
    _actor_workspaces(c)


def _actor_workspaces(c: Any) -> None:
    """An actor's workspace is where all of its sessions ran: the one folder of them, or
    the folder that holds them all (their common path) when they ran in several, or none
    when one of them has no folder. Scopes test it (``in_scope``): an actor is visible only
    to a caller who sees every session it was made of, whatever order they were derived
    in (a log may name a parent session of another workspace)."""
    folders: dict[str, set[str | None]] = {}
    for actor_id, cwd in c.execute(
        "SELECT a.actor_id, sa.cwd FROM actor_session a "
        "LEFT JOIN session_actor sa ON sa.session_id = a.session_id"
    ):
        folders.setdefault(actor_id, set()).add(cwd or None)
    updates = []
    for actor_id, seen in folders.items():
        where: str | None = None
        if None not in seen:
            paths = sorted(os.path.normpath(p) for p in seen if p)
            where = paths[0] if len(paths) == 1 else _common_folder(paths)
        updates.append((where, actor_id))
    c.executemany(
        "UPDATE actor SET workspace_cwd = ? WHERE actor_id = ? AND workspace_cwd IS NOT ?",
        [(w, a, w) for w, a in updates],
    )


def _common_folder(paths: Sequence[str]) -> str | None:
    try:
        return os.path.commonpath(paths)
    except ValueError:  # absolute and relative paths mixed: nothing holds them all
        return None


def _fill_counts(ds: DerivedStore, report: RebuildReport) -> None:
    counts = ds.counts()
    report.actors = counts["actors"]
    report.skills = counts["skills"]
    report.skill_uses = counts["skill_uses"]


__all__ = ["RebuildReport", "detect_skill_uses", "rebuild", "session_actor"]
