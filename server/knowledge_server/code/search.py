"""Lexical (FTS5 BM25), vector (sqlite-vec KNN) and hybrid retrieval (files ranked by
code.rank, the vectors one of its signals), and the relevance floor."""

from __future__ import annotations

import functools
import heapq
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import apsw
import numpy as np

from knowledge_server import fts
from knowledge_server.memo import RevisionMemo
from knowledge_server.schema import int_array, prefix_upper

from . import bitknn, memory, rank
from .embed import Embedder, HashingEmbedder
from .model import Capability, ChunkRecord, CodeHit, CodeSearchResult, Freshness, IndexOptions
from .store import (
    FILE_SCORE,
    FILE_WEIGHTS,
    FTS_SCORE,
    FTS_WEIGHTS,
    ID_SETS,
    is_binary,
    scalar,
    vec_table_for,
)
from .tokenize import fts_quote, matched_terms, query_terms
from .walker import walk_workspace

__all__ = ["EVIDENCE_FLOOR", "check_freshness", "describe", "get_chunk", "search"]

# The vectors' vote in hybrid ranking: a file's best chunk similarity, scaled like the
# other signals of code.rank. The offline hashing embedder's vote raises MRR on three of
# the four labelled sets and R@10 on all four; starlette's MRR falls a little
# (bench/RESULTS.md).
VEC_WEIGHT = 0.5
NEXT_CHUNK_DECAY = rank.NEXT_CHUNK_DECAY
# A term found in more than this share of chunks does not select candidates (it
# still scores them): selecting with it would make FTS5 score most of the table.
_FREQUENT_SHARE = 0.05
_MAX_TERMS = 12
# Below this many chunks every query is fast anyway: keep all terms.
_PRUNE_FROM = 5000
_MAX_K = 4096  # sqlite-vec's upper bound for k

# Candidate rows leave the text out (column 9 is NULL): a query ranks about 160
# candidates and returns at most ``limit``; only those texts are read (``_texts``).
_COLS = (
    "c.id, c.chunk_id, c.workspace, c.path, c.start_line, c.end_line, c.source_kind,"
    " c.symbol, c.language, NULL, r.rev"
)


def _scope_sql(
    workspaces: Sequence[str] | None, prefixes: Sequence[str] | None
) -> tuple[str, list[Any]]:
    """Joins/filters restricting chunks to current revisions of the chosen workspaces.

    The chunks come first and the scope tables are looked up per chunk: every query here
    starts from a few candidate chunks. CROSS JOIN fixes that order; left to itself, the
    planner starts a workspace filter from the workspace and walks all its files and
    chunks, many times the work (figures in bench/RESULTS.md)."""
    params: list[Any] = []
    sql = (
        " CROSS JOIN rev_file rf ON rf.file_id = c.file_id"
        " CROSS JOIN workspaces w ON w.current_rev_id = rf.rev_id"
        " CROSS JOIN revisions r ON r.id = rf.rev_id"
    )
    where = []
    if workspaces is not None:
        where.append("w.root IN (SELECT value FROM json_each(?))")
        params.append(_json_list(workspaces))
    if prefixes:
        ors = []
        for p in prefixes:
            ors.append("substr(c.path, 1, ?) = ?")
            params += [len(p), p]
        where.append("(" + " OR ".join(ors) + ")")
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql, params


def _chunks_under(
    conn: apsw.Connection, workspaces: Sequence[str] | None, prefixes: Sequence[str]
) -> np.ndarray | None:
    """Sorted ids of the current revisions' chunks whose path starts with one of
    ``prefixes`` (within ``workspaces``), read through the (workspace, path) index of
    file versions; None when a prefix cannot bound a range (the empty prefix)."""
    bounds = []
    for p in prefixes:
        upper = prefix_upper(p)
        if upper is None:
            return None
        bounds.append((p, upper))
    ranges = " OR ".join("(fv.path >= ? AND fv.path < ?)" for _ in bounds)
    args: list[Any] = [x for b in bounds for x in b]
    where = "w.current_rev_id IS NOT NULL"
    if workspaces is not None:
        where += " AND w.root IN (SELECT value FROM json_each(?))"
        args.append(_json_list(workspaces))
    rows = conn.execute(
        "SELECT c.id FROM workspaces w"  # noqa: S608 - conditions made here of constants and placeholders, values bound
        f" CROSS JOIN file_versions fv ON fv.workspace = w.root AND ({ranges})"
        " CROSS JOIN rev_file rf ON rf.rev_id = w.current_rev_id AND rf.file_id = fv.id"
        f" CROSS JOIN chunks c ON c.file_id = fv.id WHERE {where}",
        args,
    ).fetchall()
    return np.unique(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))


# A workspace filter that leaves out more than half of the store's current chunks (other
# workspaces indexed into the same store) ranks only the chosen workspaces' chunks, as a
# path filter does: ranked among all of them first, the other workspaces' chunks took the
# candidate places and the lexical and vector searches widened again and again.
_SCOPE_SHARE = 0.5
# Per database: the sorted chunk (or file version) ids of each scope's current revisions,
# 8 bytes an id; a few scopes at a time (a new revision, or more scopes, start afresh).
_scope_memos: dict[str, RevisionMemo[str, np.ndarray]] = defaultdict(lambda: RevisionMemo(cap=16))


_SCOPE_FILES = (
    "SELECT rf.file_id FROM workspaces w"
    " CROSS JOIN rev_file rf ON rf.rev_id = w.current_rev_id WHERE "
)
_SCOPE_CHUNKS = (
    "SELECT c.id FROM workspaces w CROSS JOIN rev_file rf ON rf.rev_id = w.current_rev_id"
    " CROSS JOIN chunks c ON c.file_id = rf.file_id WHERE "
)


def _scope_chunks(
    conn: apsw.Connection, workspaces: Sequence[str] | None, files: bool = False
) -> np.ndarray:
    """Sorted ids of the chunks (``files``: the file versions) of the current revisions
    of ``workspaces`` (None: all), remembered per revision of the store."""
    state = _store_state(conn)
    key = ("f" if files else "c") + (
        "\x00".join(sorted(workspaces)) if workspaces is not None else ""
    )
    known = _scope_memos[conn.filename].at(state) if conn.filename else {}
    ids = known.get(key)
    if ids is None:
        where, args = "w.current_rev_id IS NOT NULL", []
        if workspaces is not None:
            where += " AND w.root IN (SELECT value FROM json_each(?))"
            args.append(_json_list(workspaces))
        rows = conn.execute((_SCOPE_FILES if files else _SCOPE_CHUNKS) + where, args).fetchall()
        ids = known[key] = np.unique(
            np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        )
    return ids


def _narrow_scope(
    conn: apsw.Connection, workspaces: Sequence[str], files: bool = False
) -> np.ndarray | None:
    """The chunk (``files``: file version) ids of ``workspaces`` when they hold less than
    _SCOPE_SHARE of the store's current ones, else None (ranking everything and joining
    the scope is then cheaper than checking every match against a set)."""
    chosen = _scope_chunks(conn, workspaces, files)
    if len(chosen) >= _SCOPE_SHARE * len(_scope_chunks(conn, None, files)):
        return None
    return chosen


def _scope_and(scope: tuple[str, list[Any]], condition: str) -> str:
    """The scope's joins and filters (``_scope_sql``) with one more condition."""
    sql = scope[0]
    return f"{sql} AND {condition}" if " WHERE " in sql else f"{sql} WHERE {condition}"


def _json_list(items: Sequence[object]) -> str:
    return json.dumps(list(items))


# Document frequencies per database: fts5vocab counts a term's documents by walking its
# posting list, long for a common word, and queries repeat words.
# Keyed by the store's state (``_store_state``), which every write changes.
_df_memos: dict[str, RevisionMemo[str, int]] = defaultdict(RevisionMemo)


# The store's state (``_store_state``) as one search read it, for the rest of that search:
# it asked for it in four to five places, a statement each. Per search and not per
# connection: a connection's data version is only current once its read transaction has
# read something, so a state remembered across searches could outlive a re-index.
P = ParamSpec("P")
R = TypeVar("R")
_search_state: ContextVar[tuple[apsw.Connection, tuple[Any, ...]] | None] = ContextVar(
    "code_search_state", default=None
)


def _store_state(conn: apsw.Connection) -> tuple[Any, ...]:
    """The store's state as ``memory.state_key`` reads it (highest chunk rowid, highest
    file version id, the workspaces' current revisions, both full-text tables' totals):
    what the memos of document frequencies and scopes, and the copy in memory, are
    valid for."""
    held = _search_state.get()
    if held is not None and held[0] is conn:
        return held[1]
    return memory.state_key(conn)


def _doc_freqs(
    conn: apsw.Connection,
    terms: list[str],
    mem: memory.StoreMemory | None = None,
    workspaces: Sequence[str] | None = None,
) -> tuple[dict[str, int], int]:
    """({term: chunks containing it}, highest chunk rowid); from the store's copy in
    memory when every term is a token as it stands (fts5vocab looks terms up verbatim).
    With ``workspaces``: (the chunks of theirs containing it, how many chunks they have),
    so that what other workspaces hold changes nothing here (``_scoped_stats``)."""
    if mem is not None and mem.chunk_ids.size:
        tids = [mem.chunks.exact(t) for t in terms]
        if None not in tids:
            stats = mem.stats(workspaces)
            cs = stats[0] if stats is not None else None
            return (
                {
                    t: mem.chunks.df(i, cs)
                    for t, i in zip(terms, tids, strict=True)
                    if i is not None
                },
                cs.n if cs is not None else int(mem.chunk_ids[-1]),
            )
    if workspaces is not None:
        df, _ = _doc_freqs(conn, terms)
        present = [t for t in terms if df[t] > 0]
        found = _scoped_df(conn, "chunks", present, workspaces)
        return {t: found.get(t, 0) for t in terms}, _scoped_stats(conn, "chunks", workspaces)[0]
    state = _store_state(conn)
    # In-memory databases all have the name "": nothing is remembered for them.
    known = _df_memos[conn.filename].at(state) if conn.filename else {}
    missing = [t for t in terms if t not in known]
    if missing:
        found = dict.fromkeys(missing, 0)
        for term, doc in conn.execute(
            "SELECT term, doc FROM chunks_fts_vocab WHERE term IN (SELECT value FROM json_each(?))",
            (_json_list(missing),),
        ):
            found[term] = int(doc)
        known.update(found)
    return {t: known[t] for t in terms}, int(state[0] or 1)


# A search scoped to some workspaces is ranked with their statistics alone: BM25's idf and
# average row length, the rare terms, the files' idf, the vectors' baseline. Counted over
# the whole store, they made a scoped search's answer (which files pass the relevance
# floor, how they order, their scores) depend on what other workspaces hold, words a
# caller of one workspace could probe another tenant's code for. Every row of the chosen
# workspaces counts, as FTS5 counts every row of its table: all their file versions.
_SCOPED_TABLES = {
    # table -> (its full-text table, from the workspaces' file versions to its rows, a row's
    # id, from a full-text match to its file version). CROSS JOIN fixes each order: the
    # other way, SQLite walked the workspace's file versions for every match.
    "chunks": (
        "chunks_fts",
        "file_versions fv CROSS JOIN chunks c ON c.file_id = fv.id",
        "c.id",
        "chunks_fts CROSS JOIN chunks c ON c.id = chunks_fts.rowid"
        " CROSS JOIN file_versions fv ON fv.id = c.file_id",
    ),
    "files": (
        "files_fts",
        "file_versions fv",
        "fv.id",
        "files_fts CROSS JOIN file_versions fv ON fv.id = files_fts.rowid",
    ),
}
_IN_SCOPE = "fv.workspace IN (SELECT value FROM json_each(?))"
_scoped_memos: dict[str, RevisionMemo[tuple[str, ...], Any]] = defaultdict(
    lambda: RevisionMemo(cap=20_000)
)


def _scope_key(workspaces: Sequence[str]) -> str:
    return "\x00".join(sorted(set(workspaces)))


def _scoped_stats(conn: apsw.Connection, table: str, workspaces: Sequence[str]) -> tuple[int, int]:
    """(rows, tokens) of ``table``'s full-text rows ("chunks" or "files") in the
    workspaces, remembered per state of the store."""
    fts_table, rows, row_id, _ = _SCOPED_TABLES[table]
    known = _scoped_memos[conn.filename].at(_store_state(conn)) if conn.filename else {}
    key = (table, _scope_key(workspaces), "stats")
    held = known.get(key)
    if held is None:
        n, tokens = cast(
            tuple[int, int],
            conn.execute(
                f"SELECT count(*), coalesce(sum(knowledge_docsize(d.sz)), 0) FROM {rows}"  # noqa: S608 - constants
                f" CROSS JOIN {fts_table}_docsize d ON d.id = {row_id} WHERE {_IN_SCOPE}",
                (_json_list(workspaces),),
            ).fetchone(),
        )
        held = known[key] = (int(n), int(tokens))
    return held


def _scoped_df(
    conn: apsw.Connection, table: str, terms: Sequence[str], workspaces: Sequence[str]
) -> dict[str, int]:
    """{term: rows of ``table`` in the workspaces that hold it}, remembered per state."""
    fts_table, _, _, matches = _SCOPED_TABLES[table]
    known = _scoped_memos[conn.filename].at(_store_state(conn)) if conn.filename else {}
    scope = _scope_key(workspaces)
    out = {}
    for t in terms:
        key = (table, scope, "df", t)
        if key not in known:
            # A count per term, in SQLite alone: one query for all of them (which terms
            # each row holds, from an FTS5 function) cost a Python call per match.
            known[key] = int(
                scalar(
                    conn,
                    f"SELECT count(*) FROM {matches} WHERE {fts_table} MATCH ? AND {_IN_SCOPE}",  # noqa: S608 - constants; the term is bound
                    (fts_quote(t), _json_list(workspaces)),
                )
            )
        out[t] = known[key]
    return out


def _scoped_score(
    conn: apsw.Connection,
    table: str,
    phrases: Sequence[str],
    workspaces: Sequence[str] | None,
    idf: Mapping[str, float] | None = None,
) -> tuple[str, list[Any]]:
    """The score expression of a full-text query over ``table`` whose MATCH expression
    holds ``phrases`` in that order, and its parameters: FTS5's bm25() for the whole
    store, ``knowledge_bm25`` with the workspaces' statistics (``idf``: each phrase's,
    when the caller has them)."""
    native: tuple[str, list[Any]] = (FTS_SCORE if table == "chunks" else FILE_SCORE), []
    if workspaces is None:
        return native
    fts_table = _SCOPED_TABLES[table][0]
    weights = FTS_WEIGHTS if table == "chunks" else FILE_WEIGHTS
    n, tokens = _scoped_stats(conn, table, workspaces)
    if n == fts.row_count(_store_state(conn)[3 if table == "chunks" else 4]):
        # The scope holds every row (one workspace in the store): its statistics are the
        # table's, and bm25() gives the very same scores without a call per row.
        return native
    if idf is None:
        df = _scoped_df(conn, table, list(dict.fromkeys(phrases)), workspaces)
        idf = {t: fts.bm25_idf(n, df[t]) for t in phrases}
    return fts.scoped_score(fts_table, n, tokens, weights, [idf[t] for t in phrases])


def _split_terms(
    conn: apsw.Connection,
    terms: list[str],
    mem: memory.StoreMemory | None = None,
    workspaces: Sequence[str] | None = None,
) -> tuple[list[str], list[str]]:
    """(terms present in the index, the rarer ones that select candidates)."""
    if not terms:
        return [], []
    df, total = _doc_freqs(conn, terms, mem, workspaces)
    present = sorted((t for t in terms if df[t] > 0), key=lambda t: df[t])[:_MAX_TERMS]
    if len(present) <= 1:
        return present, present
    if total < _PRUNE_FROM:
        return present, present
    rare = [t for t in present if df[t] <= total * _FREQUENT_SHARE]
    return present, rare or present[:1]


def _lexical(
    conn: apsw.Connection,
    terms: list[str],
    rare: list[str],
    scope: tuple[str, list[Any]],
    n: int,
    among: np.ndarray | None = None,
    workspaces: Sequence[str] | None = None,
) -> list[tuple[Any, ...]]:
    """BM25 over all ``terms``; when frequent terms were set aside, the rare ones pick
    the candidates first and the full query only scores those (FTS5 cost grows with
    the number of matching rows, and a frequent term matches most of the table).
    With ``among`` (a path filter's chunk ids), only those chunks are scored."""
    if not terms:
        return []
    if among is not None:
        with ID_SETS.hold(frozenset(among.tolist())) as token:
            return _lexical_in(conn, terms, rare, scope, n, token, workspaces)
    return _lexical_in(conn, terms, rare, scope, n, None, workspaces)


# The inner query's row count and worst score, read with each row of the outer one.
_CUT = "(SELECT count(*) FROM lex), (SELECT max(rank) FROM lex)"


def _best_in_scope(
    conn: apsw.Connection,
    table: str,
    match: str,
    only: str,
    extra: list[Any],
    fetch: int,
    n: int,
    score: int,
    query: Callable[[int], list[tuple[Any, ...]]],
) -> list[tuple[Any, ...]]:
    """The best ``n`` rows in scope, from ``query(fetch)``: its inner query keeps the best
    ``fetch`` matches of the whole ``table`` by (score, rowid), the scope is applied after
    it, and each row ends with the two ``_CUT`` columns (dropped here). The answer is whole
    when the inner query saw every match, or when the ``n``-th row in scope (its score at
    index ``score``) scores strictly better than the worst match kept (every match left
    out scores no better than that one, so none of them, however its path sorts, can take
    a place). Otherwise (other workspaces or old revisions took the places, or equal
    scores straddle the cut) more are asked for, eight times as many, and past 50,000
    every match. Lower scores are better (FTS5's sign)."""
    while True:
        rows = query(fetch)
        kept = [r[:-2] for r in rows]
        if fetch < 0:
            return kept  # every match was ranked
        if rows:
            seen, worst = rows[0][-2], rows[0][-1]
            if seen < fetch or (len(kept) >= n and worst > kept[n - 1][score]):
                return kept
        if not rows:
            got = scalar(
                conn,
                f"SELECT count(*) FROM (SELECT rowid FROM {table} WHERE {table} MATCH ?{only}"  # noqa: S608 - table and only are constants here, values bound
                " LIMIT ?)",
                (match, *extra, fetch),
            )
            if got < fetch:
                return kept
        # Past 50,000 matches, all of them (SQLite's LIMIT -1): the answer is whole.
        fetch = fetch * 8 if fetch * 8 < 50_000 else -1


def _lexical_in(
    conn: apsw.Connection,
    terms: list[str],
    rare: list[str],
    scope: tuple[str, list[Any]],
    n: int,
    token: int | None,
    workspaces: Sequence[str] | None = None,
) -> list[tuple[Any, ...]]:
    # A path filter's chunks are checked per match, before bm25 is computed for it.
    only = "" if token is None else " AND knowledge_in_set(rowid, ?)"
    extra: list[Any] = [] if token is None else [token]
    expr = " OR ".join(fts_quote(t) for t in terms)
    pick = " OR ".join(fts_quote(t) for t in rare)
    if rare == terms:
        match = expr
    else:
        # Logically just `pick`, but the frequent terms join the expression so they
        # still count in BM25; FTS5 evaluates the AND by seeking their posting lists
        # to the candidates instead of scanning them.
        match = f"({pick}) AND ({expr})"
    score, score_args = _scoped_score(
        conn, "chunks", terms if rare == terms else rare + terms, workspaces
    )

    def query(fetch: int) -> list[tuple[Any, ...]]:
        return conn.execute(
            f"WITH lex AS MATERIALIZED (SELECT rowid, {score} AS rank FROM chunks_fts"  # noqa: S608 - constants and _scope_sql's placeholders; the MATCH expression is bound
            f" WHERE chunks_fts MATCH ?{only} ORDER BY rank, rowid LIMIT ?)"
            f" SELECT {_COLS}, lex.rank, {_CUT} FROM lex CROSS JOIN chunks c ON c.id = lex.rowid{scope[0]}"
            " ORDER BY lex.rank, c.path, c.start_line, c.id LIMIT ?",
            [*score_args, match, *extra, fetch, *scope[1], n],
        ).fetchall()

    return _best_in_scope(conn, "chunks_fts", match, only, extra, max(n * 3, 100), n, 11, query)


def _vector(
    conn: apsw.Connection,
    vtbl: str,
    dim: int,
    qvec: np.ndarray,
    scope: tuple[str, list[Any]],
    n: int,
    also: Sequence[tuple[Any, ...]] = (),
    among: np.ndarray | None = None,
    rows_of: Callable[[Sequence[int]], list[tuple[Any, ...]]] | None = None,
) -> tuple[list[tuple[Any, ...]], dict[int, float]]:
    """KNN in sqlite-vec (or code.bitknn for binary tables), then exact cosine
    rescoring of the candidates. With ``among`` (a path filter's chunk ids, or the chosen
    workspaces' current ones: ``_vector_among``), the KNN looks only at those chunks, so
    the candidates are the scope's nearest whatever else the store holds. ``rows_of``
    reads the candidates' rows in scope (the store's copy in memory, ``_Held.rows``)
    instead of SQL.

    Returns the best ``n`` rows, each ending with its cosine distance (1 - similarity),
    and the similarity of every candidate and of every row in ``also`` (the hybrid
    lexical candidates, which the vector lane ranks too). The float
    vectors of all of them are read in one query."""
    q = np.ascontiguousarray(qvec, dtype=np.float32)
    binary = is_binary(dim)
    # Binary distances are coarse: fetch a few times more candidates than needed.
    k = min(max(n * (2 if binary else 1), 60), _MAX_K)
    # A float table's KNN takes the chunks as sqlite-vec's rowid filter.
    only = "" if among is None or binary else " AND rowid IN (SELECT value FROM carray(?))"
    extra: list[Any] = [int_array(among.tolist())] if only and among is not None else []
    while True:
        if binary:
            # Hamming KNN over an in-memory copy of the bits (code.bitknn), then the
            # candidates' rows, ordered here by (distance, path, line) as SQL would.
            near, held = bitknn.nearest(conn, vtbl, dim, q, k, among)
            if among is not None:
                held = min(held, len(among))
            distance = dict(near)
            if not distance:
                rows = []
            elif rows_of is not None:
                rows = rows_of(list(distance))
            else:
                rows = conn.execute(
                    f"SELECT {_COLS} FROM chunks c"  # noqa: S608 - constants and _scope_sql's placeholders
                    + _scope_and(scope, "c.id IN (SELECT value FROM carray(?))"),
                    [*scope[1], int_array(distance)],
                ).fetchall()
            rows = [(*r, distance[r[0]]) for r in rows]
            rows.sort(key=lambda r: (r[11], r[3], r[4]))
        else:
            rows = conn.execute(
                f"WITH knn AS MATERIALIZED (SELECT rowid, distance FROM {vtbl}"  # noqa: S608 - vtbl is a checked vec_<hex> name (code.store), scope as above
                f" WHERE embedding MATCH ? AND k = ?{only})"
                f" SELECT {_COLS}, knn.distance FROM knn CROSS JOIN chunks c ON c.id = knn.rowid"
                f"{scope[0]} ORDER BY knn.distance, c.path, c.start_line",
                [q.tobytes(), k, *extra, *scope[1]],
            ).fetchall()
        # With ``among`` the KNN looked at the scope's chunks alone: whole. Otherwise
        # vectors of other workspaces or old revisions may have taken the places: widen
        # the search, unless the table holds fewer vectors than asked for.
        if among is not None or len(rows) >= n or k >= _MAX_K:
            break
        if not binary:
            held = int(scalar(conn, f"SELECT count(*) FROM {vtbl}_f"))  # noqa: S608 - vtbl is a checked vec_<hex> name (code.store)
        if held <= k:
            break
        k = min(k * 4, _MAX_K)
    ids = list(dict.fromkeys([r[0] for r in rows] + [r[0] for r in also]))
    if not ids:
        return [], {}
    found = cast(
        list[tuple[int, bytes]],
        conn.execute(
            f"SELECT id, v FROM {vtbl}_f WHERE id IN (SELECT value FROM carray(?))",  # noqa: S608 - vtbl is a checked vec_<hex> name (code.store)
            (int_array(ids),),
        ).fetchall(),
    )
    sims: dict[int, float] = {}
    if found:
        m = np.frombuffer(b"".join(v for _, v in found), dtype=np.float32).reshape(len(found), -1)
        sims = dict(zip((i for i, _ in found), (m @ q).tolist(), strict=True))
    # A candidate without its float vector (an interrupted fill) is no vector hit.
    rows = [r for r in rows if r[0] in sims]
    rows.sort(key=lambda r: (-sims[r[0]], r[3], r[4]))
    return [(*r[:11], 1.0 - sims[r[0]]) for r in rows[:n]], sims


def _vector_among(
    conn: apsw.Connection,
    workspaces: Sequence[str] | None,
    prefixes: Sequence[str] | None,
    among: np.ndarray | None,
) -> np.ndarray | None:
    """The chunks the vectors' KNN looks at (``_vector``): a path filter's (``among``),
    or the chosen workspaces' current ones (remembered per state of the store, so the
    same array comes back and code.bitknn keeps its positions); None unscoped."""
    if prefixes:
        return among
    return _scope_chunks(conn, workspaces) if workspaces is not None else None


# How many stored vectors the vectors' baseline is computed over (``_vec_baseline``).
_BASELINE_VECTORS = 512
_baselines: dict[tuple[str, str, str | None], tuple[object, np.ndarray]] = {}


def _vec_baseline(
    conn: apsw.Connection, vtbl: str, qvec: np.ndarray, workspaces: Sequence[str] | None = None
) -> tuple[float, float]:
    """(centre, spread) of the question's similarity to an even sample of the store's
    vectors, as robust estimates of the mean and standard deviation: how much it resembles
    any chunk. A similarity is evidence of meaning when it stands out from that (HIT_VEC_Z,
    QUESTION_VEC_Z), whatever the model's scale: e5 puts unrelated texts near 0.7, the
    hashing embedder near 0. The sample (up to _BASELINE_VECTORS ids spread evenly between
    the table's lowest and highest, read by rowid) is kept while the store, the table's id
    range and the revisions' count of chunks without vectors stay the same (vectors filled
    in later for older chunks change that count). With ``workspaces``, the sample is of
    their chunks alone (every file version's, as ``_scoped_stats`` counts rows), spread
    evenly over their ids: what other workspaces hold moves no baseline."""
    scope = _scope_key(workspaces) if workspaces is not None else None
    if len(_baselines) > 64:
        _baselines.clear()
    key = (conn.filename, vtbl, scope)
    lo, hi = cast(
        tuple[int | None, int | None],
        conn.execute(f"SELECT min(id), max(id) FROM {vtbl}_f").fetchone(),  # noqa: S608 - vtbl is a checked vec_<hex> name (code.store)
    )
    missing = scalar(conn, "SELECT coalesce(sum(vec_missing), 0) FROM revisions")
    state = (_store_state(conn), lo, hi, missing)
    held = _baselines.get(key)
    if held is None or held[0] != state:
        found = []
        ids: list[int] | None = None
        if workspaces is not None:
            theirs = [
                int(r[0])
                for r in conn.execute(
                    f"SELECT c.id FROM {_SCOPED_TABLES['chunks'][1]} WHERE {_IN_SCOPE}"  # noqa: S608 - constants
                    " ORDER BY c.id",
                    (_json_list(workspaces),),
                )
            ]
            step = max(1, len(theirs) // _BASELINE_VECTORS)
            ids = theirs[::step][:_BASELINE_VECTORS]
        elif lo is not None and hi is not None:  # both or neither
            step = max(1, (int(hi) - int(lo) + 1) // _BASELINE_VECTORS)
            ids = list(range(int(lo), int(hi) + 1, step))[:_BASELINE_VECTORS]
        if ids:
            found = cast(
                list[tuple[bytes]],
                conn.execute(
                    f"SELECT v FROM {vtbl}_f WHERE id IN (SELECT value FROM carray(?))",  # noqa: S608 - as above
                    (int_array(ids),),
                ).fetchall(),
            )
        m = np.frombuffer(b"".join(v for (v,) in found), dtype=np.float32).reshape(
            len(found), qvec.shape[-1]
        )
        held = _baselines[key] = (state, m)
    m = held[1]
    if len(m) < 2:
        return 0.0, 1.0
    sims = m @ np.ascontiguousarray(qvec, dtype=np.float32)
    # Median and scaled median absolute deviation: the few chunks that do match (in a small
    # workspace, a large part of the sample) do not move the baseline they are judged by.
    centre = _median(sims)
    spread = 1.4826 * _median(np.abs(sims - centre))
    return centre, spread or 1.0


def _median(a: np.ndarray) -> float:
    """``np.median`` of a short vector, without its generic machinery (called twice per
    question)."""
    s = np.sort(a)
    n = len(s)
    return float(s[(n - 1) // 2] + s[n // 2]) / 2


# Files per question ranked at file level.
_FILE_POOL = 40
# From this many file versions on, terms in more than a tenth of them (idf below log 9) do
# not pick file candidates (``_file_match``).
_FILE_PRUNE_FROM = 500
_RARE_IDF = math.log(9)
# Chunks ranked per question: their best per file is the chunk signal. 60, 100 or 200 of
# them, and a second query for the best chunks of the best files, gave the same figures on
# the labelled sets (bench/RESULTS.md); 60 costs least.
_CHUNK_POOL = 60
_VEC_POOL = 30
# A question whose best file answers less than this share of it (rank.evidence_share)
# has no code answer: no items, and the lane says so. Set on the labelled sets: below
# it are made-up words, UUIDs and questions about other projects (bench/RESULTS.md).
EVIDENCE_FLOOR = 0.12
# How many of the best files are checked for it.
_EVIDENCE_FILES = 3
# A file is returned when it holds a share of the question itself (rank.evidence_share),
# is named by it, or its best similarity stands HIT_VEC_Z standard deviations above the
# question's baseline (``_vec_baseline``): a file that only a two-letter word brought, or
# the vectors at about the similarity of any chunk, is no evidence.
HIT_FLOOR = 1e-9
HIT_VEC_Z = 1.0
# With a semantic embedder, a question whose best files hold too little of its words is
# still answered when one of them stands this far above its baseline: meaning found
# without the words ("configuration" finding read_settings).
QUESTION_VEC_Z = 5.0

_file_df_memos: dict[str, RevisionMemo[str, int]] = defaultdict(RevisionMemo)


def _file_weights(
    conn: apsw.Connection, terms: list[str], workspaces: Sequence[str] | None = None
) -> tuple[dict[str, float], int]:
    """({term: idf} over file versions (FTS5's BM25 idf), how many there are); a term in
    no file gets the highest idf there is. With ``workspaces``, over theirs alone."""
    if workspaces is not None:
        n = _scoped_stats(conn, "files", workspaces)[0]
        df = _scoped_df(conn, "files", terms, workspaces)
        return {t: fts.bm25_idf(n, df[t]) for t in terms}, n
    state = _store_state(conn)
    known = _file_df_memos[conn.filename].at(state) if conn.filename else {}
    for t in terms:
        if t not in known:
            known[t] = int(
                scalar(
                    conn,
                    "SELECT count(*) FROM files_fts WHERE files_fts MATCH ?",
                    (fts_quote(t),),
                )
            )
    # The rows of the file table, as FTS5's bm25() counts them (not the highest id: a
    # workspace indexed again and again leaves ids far above the rows still held).
    n = fts.row_count(state[4])
    return {t: fts.bm25_idf(n, known[t]) for t in terms}, n


def _file_pick(terms: list[str], weights: dict[str, float], n_files: int) -> list[str] | None:
    """The terms that pick file candidates when some do not: with many files, those in
    more than a tenth of them only score the files the rarer ones pick (as ``_lexical``
    does for chunks: FTS5 then seeks their long posting lists instead of scoring every
    file that has a common word). None: every term picks."""
    if len(terms) < 2 or n_files < _FILE_PRUNE_FROM:
        return None
    rare = [t for t in terms if weights.get(t, 0.0) >= _RARE_IDF]
    if not rare:
        rare = [max(terms, key=lambda t: weights.get(t, 0.0))]
    return None if len(rare) == len(terms) else rare


def _file_match(terms: list[str], weights: dict[str, float], n_files: int) -> str:
    """The MATCH expression of the file-level query (``_file_pick``)."""
    expr = " OR ".join(fts_quote(t) for t in terms)
    pick = _file_pick(terms, weights, n_files)
    if pick is None:
        return expr
    return "(" + " OR ".join(fts_quote(t) for t in pick) + f") AND ({expr})"


def _file_candidates(
    conn: apsw.Connection,
    terms: list[str],
    weights: dict[str, float],
    n_files: int,
    workspaces: Sequence[str] | None,
    prefixes: Sequence[str] | None,
    n: int,
) -> list[tuple[int, str, str, float]]:
    """The best ``n`` current file versions in scope by whole-file BM25 (text and path):
    (file_id, path, language, score > 0). A few workspaces of a larger store score only
    their files (_narrow_scope)."""
    if not terms:
        return []
    only = _narrow_scope(conn, workspaces, files=True) if workspaces is not None else None
    if only is not None:
        if not len(only):
            return []
        with ID_SETS.hold(frozenset(only.tolist())) as token:
            return _file_query(conn, terms, weights, n_files, workspaces, prefixes, n, token)
    return _file_query(conn, terms, weights, n_files, workspaces, prefixes, n, None)


def _file_query(
    conn: apsw.Connection,
    terms: list[str],
    weights: dict[str, float],
    n_files: int,
    workspaces: Sequence[str] | None,
    prefixes: Sequence[str] | None,
    n: int,
    token: int | None,
) -> list[tuple[int, str, str, float]]:
    where: list[str] = []
    params: list[Any] = []
    if workspaces is not None:
        where.append("w.root IN (SELECT value FROM json_each(?))")
        params.append(_json_list(workspaces))
    if prefixes:
        where.append("(" + " OR ".join("substr(fv.path, 1, ?) = ?" for _ in prefixes) + ")")
        params += [x for p in prefixes for x in (len(p), p)]
    cond = (" WHERE " + " AND ".join(where)) if where else ""
    fetch = max(n * 4, 200)
    only = "" if token is None else " AND knowledge_in_set(rowid, ?)"
    extra: list[Any] = [] if token is None else [token]
    match = _file_match(terms, weights, n_files)
    pick = _file_pick(terms, weights, n_files)
    # The file weights are the files' idf in the scope: the scoped score takes them.
    score, score_args = _scoped_score(
        conn, "files", pick + terms if pick else terms, workspaces, weights
    )

    def query(fetch: int) -> list[tuple[Any, ...]]:
        return conn.execute(
            f"WITH lex AS MATERIALIZED (SELECT rowid, {score} AS rank FROM files_fts"  # noqa: S608 - constants and placeholders; the MATCH expression is bound
            f" WHERE files_fts MATCH ?{only} ORDER BY rank, rowid LIMIT ?)"
            f" SELECT fv.id, fv.path, fv.language, lex.rank, {_CUT} FROM lex"
            " CROSS JOIN file_versions fv ON fv.id = lex.rowid"
            " CROSS JOIN rev_file rf ON rf.file_id = fv.id"
            f" CROSS JOIN workspaces w ON w.current_rev_id = rf.rev_id{cond}"
            " ORDER BY lex.rank, fv.path, fv.id LIMIT ?",
            [*score_args, match, *extra, fetch, *params, n],
        ).fetchall()

    rows = _best_in_scope(conn, "files_fts", match, only, extra, fetch, n, 3, query)
    return [(r[0], r[1], r[2], -float(r[3])) for r in rows]


def _shares(
    conn: apsw.Connection,
    weights: dict[str, float],
    file_ids: Sequence[int],
    ids: rank.OpaqueIds | None = None,
    least: float = 0.0,
) -> dict[int, float]:
    """file_id -> the share of the question it answers (rank.evidence_share), from one
    full-text lookup of the judged terms (rank.judged_terms)."""
    judged = rank.judged_terms(weights)
    if not file_ids:
        return {}
    present: dict[int, list[str]] = defaultdict(list)
    rows = int_array(file_ids)
    # One query for up to 62 terms (a 64-bit mask): knowledge_phrases says which of them
    # each file holds.
    for start in range(0, len(judged), 62):
        group = judged[start : start + 62]
        for fid, mask in conn.execute(
            "SELECT rowid, knowledge_phrases(files_fts) FROM files_fts WHERE files_fts MATCH ?"
            " AND rowid IN (SELECT value FROM carray(?))",
            (" OR ".join(fts_quote(t) for t in group), rows),
        ):
            present[fid].extend(t for i, t in enumerate(group) if int(mask) >> i & 1)
    return {f: rank.evidence_share(weights, present.get(f, ()), ids, least) for f in file_ids}


def _file_of(conn: apsw.Connection, chunk_ids: Sequence[int]) -> dict[int, int]:
    if not chunk_ids:
        return {}
    return dict(
        cast(
            list[tuple[int, int]],
            conn.execute(
                "SELECT id, file_id FROM chunks WHERE id IN (SELECT value FROM carray(?))",
                (int_array(chunk_ids),),
            ).fetchall(),
        )
    )


def _file_facts(
    conn: apsw.Connection, file_ids: Sequence[int]
) -> dict[int, tuple[int, bool, int, str]]:
    """file_id -> (the file version's number of chunks, whether it says it was generated,
    how many command-line options it defines, its workspace)."""
    return {
        int(fid): (int(n), bool(gen), int(cli), str(ws))
        for fid, n, gen, cli, ws in conn.execute(
            "SELECT id, n_chunks, generated, cli_options, workspace FROM file_versions"
            " WHERE id IN (SELECT value FROM carray(?))",
            (int_array(file_ids),),
        )
    }


# file_id -> the names its chunks define (each symbol, its first and last dotted part),
# per store state.
_symbol_memos: dict[str, RevisionMemo[int, frozenset[str]]] = defaultdict(RevisionMemo)


def _defining(conn: apsw.Connection, file_ids: Sequence[int], names: frozenset[str]) -> int | None:
    """The one of ``file_ids`` that defines a symbol named one of ``names`` (the whole
    symbol, or its first or last dotted part; rank.DEFINED_WEIGHT); None when none or
    several do. Each file's names are read once per store state."""
    if not names or not file_ids:
        return None
    known = _symbol_memos[conn.filename].at(_store_state(conn)) if conn.filename else {}
    missing = [f for f in file_ids if f not in known]
    if missing:
        read: dict[int, set[str]] = {f: set() for f in missing}
        for fid, symbol in conn.execute(
            "SELECT file_id, symbol FROM chunks WHERE file_id IN (SELECT value FROM carray(?))"
            " AND symbol != ''",
            (int_array(missing),),
        ):
            read[int(fid)].update(rank.name_parts(symbol))
        known.update((f, frozenset(v)) for f, v in read.items())
    found = [f for f in file_ids if not known[f].isdisjoint(names)]
    return found[0] if len(found) == 1 else None


def _first_chunks(
    conn: apsw.Connection, file_ids: Sequence[int], scope: tuple[str, list[Any]]
) -> dict[int, tuple[Any, ...]]:
    """file_id -> its first chunk's row (a file found by its path or whole text alone)."""
    if not file_ids:
        return {}
    firsts = [
        r[0]
        for r in conn.execute(
            "SELECT (SELECT id FROM chunks WHERE file_id = f.value ORDER BY start_line, id LIMIT 1)"
            " FROM carray(?) f",
            (int_array(file_ids),),
        )
        if r[0] is not None
    ]
    # Found by path alone, with no chunk at all (an empty file): none.
    return _rows_by_file(conn, firsts, scope)


def _rows_by_file(
    conn: apsw.Connection, chunk_ids: list[int], scope: tuple[str, list[Any]]
) -> dict[int, tuple[Any, ...]]:
    """file_id -> the row of the one chunk of ``chunk_ids`` in it (a BM25 of 0), in scope."""
    if not chunk_ids:
        return {}
    rows = conn.execute(
        f"SELECT {_COLS}, 0.0, c.file_id FROM chunks c"  # noqa: S608 - constants and _scope_sql's placeholders
        + _scope_and(scope, "c.id IN (SELECT value FROM carray(?))"),
        [*scope[1], int_array(chunk_ids)],
    ).fetchall()
    return {cast(int, r[12]): r[:12] for r in rows}


# A named line between two chunks (a blank line, a comment between definitions) is
# answered by a chunk at most this many lines away; a line past the file's end by none.
LINE_SLACK = 5


def _chunks_at(
    conn: apsw.Connection,
    lines: Sequence[tuple[int, tuple[int, int]]],
    scope: tuple[str, list[Any]],
) -> dict[int, tuple[Any, ...]]:
    """file_id -> the row of the chunk at the lines, for each (file_id, (first, last))
    (a file the question names with a line or range, "config.py:445"): the chunk that
    holds most of them (the smallest of those: a method rather than its class), else the
    nearest within LINE_SLACK lines; none for lines the file does not have."""
    ids = []
    for fid, (first, last) in lines:
        row = conn.execute(
            "SELECT id, max(start_line - ?2, ?1 - end_line, 0) AS gap,"
            " min(end_line, ?2) - max(start_line, ?1) AS held FROM chunks"
            " WHERE file_id = ?3 AND gap <= ?4"
            " ORDER BY gap, held DESC, end_line - start_line, id LIMIT 1",
            (first, last, fid, LINE_SLACK),
        ).fetchone()
        if row is not None:
            ids.append(row[0])
    return _rows_by_file(conn, ids, scope)


def _texts(conn: apsw.Connection, ids: list[int]) -> dict[int, str]:
    """The texts of the chunks returned, in one read (the candidates were ranked without)."""
    if not ids:
        return {}
    return dict(
        cast(
            list[tuple[int, str]],
            conn.execute(
                "SELECT id, text FROM chunks WHERE id IN (SELECT value FROM carray(?))",
                (int_array(ids),),
            ).fetchall(),
        )
    )


def _snippet(text: str, terms: list[str], chars: int) -> str:
    if len(text) <= chars:
        return text
    low = text.lower()
    pos = min((p for p in (low.find(t) for t in terms) if p >= 0), default=0)
    start = max(0, min(pos - chars // 3, len(text) - chars))
    return text[start : start + chars]


def _scope_state(
    conn: apsw.Connection, workspaces: Sequence[str] | None, embedder: Embedder | None
) -> tuple[str, Capability, str | None, dict[str, str]]:
    """(index_rev label, capability, degradation reason, {root: rev}) for the scope."""
    sql = (
        "SELECT w.root, r.rev, r.embedder, r.vec_missing, r.chunks FROM workspaces w"
        " JOIN revisions r ON r.id = w.current_rev_id"
    )
    params: list[Any] = []
    if workspaces is not None:
        sql += " WHERE w.root IN (SELECT value FROM json_each(?))"
        params.append(_json_list(workspaces))
    rows = cast(
        list[tuple[str, str, str | None, int, int]],
        conn.execute(sql + " ORDER BY w.root", params).fetchall(),
    )
    revs = {r[0]: r[1] for r in rows}
    label = rows[0][1] if len(rows) == 1 else ";".join(f"{r[0]}={r[1]}" for r in rows)
    if embedder is None:
        return label, "degraded", "no embedder configured; lexical only", revs
    reasons = []
    missing = sum(int(r[3]) for r in rows if r[2] == embedder.identity)
    total = sum(int(r[4]) for r in rows)
    if any(r[2] != embedder.identity for r in rows):
        reasons.append("index built with another embedder; lexical only")
    elif missing:
        reasons.append(
            f"vectors not ready: {total - missing}/{total} chunks embedded; lexical only"
        )
    vtbl = vec_table_for(conn, embedder.identity, embedder.dim, create=False)
    if vtbl is None and not reasons:
        reasons.append("no vectors stored; lexical only")
    if reasons:
        return label, "degraded", "; ".join(reasons), revs
    return label, "full", None, revs


def _hit(r: tuple[Any, ...], score: float, why: list[str], lexical: bool) -> CodeHit:
    return CodeHit(
        id="chunk:" + r[1],
        chunk_id=r[1],
        workspace=r[2],
        path=r[3],
        start_line=r[4],
        end_line=r[5],
        source_kind=r[6],
        symbol=r[7],
        language=r[8],
        score=round(score, 6),
        why=why,
        snippet="",
        index_rev=r[10],
        row_id=r[0],
        lexical=lexical,
    )


class _Held:
    """A search answered from the store's copy in memory (code.memory): what the SQL
    statements of ``_file_ranked`` return, the same rows in the same order."""

    def __init__(
        self,
        mem: memory.StoreMemory,
        file_tids: dict[str, int],
        chunk_tids: dict[str, int],
        workspaces: Sequence[str] | None = None,
    ) -> None:
        self.mem, self.ftid, self.ctid = mem, file_tids, chunk_tids
        # The scope's statistics (``_scoped_stats``), None for the whole store.
        stats = mem.stats(workspaces)
        self.cs: memory.Scoped | None = stats[0] if stats is not None else None
        self.fs: memory.Scoped | None = stats[1] if stats is not None else None

    @classmethod
    def of(
        cls,
        mem: memory.StoreMemory,
        file_terms: Sequence[str],
        chunk_terms: Sequence[str],
        workspaces: Sequence[str] | None = None,
    ) -> _Held | None:
        """The copy, when every term is one token to both tables' tokenizers (a phrase is
        left to SQL); ranking with the statistics of ``workspaces`` (None: every row)."""
        tids: tuple[dict[str, int], dict[str, int]] = ({}, {})
        for lex, terms, out in (
            (mem.files, file_terms, tids[0]),
            (mem.chunks, chunk_terms, tids[1]),
        ):
            for t in terms:
                tid = lex.token(t)
                if tid is None:
                    return None
                out[t] = tid
        return cls(mem, *tids, workspaces)

    def file_weights(self, terms: list[str]) -> tuple[dict[str, float], int]:
        files, fs = self.mem.files, self.fs
        n = fs.n if fs is not None else files.n
        return {t: fts.bm25_idf(n, files.df(self.ftid[t], fs)) for t in terms}, n

    def file_candidates(
        self,
        terms: list[str],
        weights: dict[str, float],
        n_files: int,
        workspaces: Sequence[str] | None,
        prefixes: Sequence[str] | None,
        n: int,
    ) -> list[tuple[int, str, str, float]]:
        if not terms:
            return []
        pick = _file_pick(terms, weights, n_files)
        files = self.mem.files
        score = files.bm25([self.ftid[t] for t in (pick + terms if pick else terms)], self.fs)
        among = self.mem.file_scope(workspaces, prefixes)
        if pick:
            among = among & files.holding([self.ftid[t] for t in pick])
        meta = self.mem.file_meta
        return [
            (meta[p][0], meta[p][2], meta[p][3], float(score[p]))
            for p in memory.best(score, among, self.mem.file_order, n)
        ]

    def lexical(
        self,
        terms: list[str],
        rare: list[str],
        workspaces: Sequence[str] | None,
        prefixes: Sequence[str] | None,
        n: int,
    ) -> list[tuple[Any, ...]]:
        if not terms:
            return []
        chunks, mem = self.mem.chunks, self.mem
        score = chunks.bm25(
            [self.ctid[t] for t in (terms if rare == terms else rare + terms)], self.cs
        )
        # A chunk of no file version (none is written so) is in no scope: the appended False.
        files = np.append(mem.file_scope(workspaces, prefixes), False)
        among = files[mem.chunk_file]
        if rare != terms:
            among &= chunks.holding([self.ctid[t] for t in rare])
        return [
            mem.chunk_row(int(p), -float(score[p]))
            for p in memory.best(score, among, mem.chunk_order, n)
        ]

    def file_of(self, chunk_ids: Sequence[int]) -> dict[int, int]:
        mem = self.mem
        if not chunk_ids or not mem.chunk_ids.size:
            return {}
        ids = np.asarray(chunk_ids, dtype=np.int64)
        pos = np.minimum(np.searchsorted(mem.chunk_ids, ids), mem.chunk_ids.size - 1)
        fp = mem.chunk_file[pos]
        ok = (mem.chunk_ids[pos] == ids) & (fp >= 0)
        return dict(zip(ids[ok].tolist(), mem.file_ids[fp[ok]].tolist(), strict=True))

    def rows(
        self,
        chunk_ids: Sequence[int],
        workspaces: Sequence[str] | None,
        prefixes: Sequence[str] | None,
    ) -> list[tuple[Any, ...]]:
        """The rows (``_COLS``) of those of ``chunk_ids`` in scope."""
        mem = self.mem
        if not chunk_ids or not mem.chunk_ids.size:
            return []
        ids = np.asarray(chunk_ids, dtype=np.int64)
        pos = np.minimum(np.searchsorted(mem.chunk_ids, ids), mem.chunk_ids.size - 1)
        scope = np.append(mem.file_scope(workspaces, prefixes), False)
        ok = (mem.chunk_ids[pos] == ids) & scope[mem.chunk_file[pos]]
        return [mem.chunk_row(int(p), 0.0)[:11] for p in pos[ok]]

    def file_facts(self, file_ids: Sequence[int]) -> dict[int, tuple[int, bool, int, str]]:
        meta, pos = self.mem.file_meta, self.mem.file_pos
        return {
            f: (
                int(meta[pos[f]][4]),
                bool(meta[pos[f]][5]),
                int(meta[pos[f]][6]),
                str(meta[pos[f]][1]),
            )
            for f in file_ids
            if f in pos
        }

    def first_chunks(
        self,
        file_ids: Sequence[int],
        workspaces: Sequence[str] | None,
        prefixes: Sequence[str] | None,
    ) -> dict[int, tuple[Any, ...]]:
        mem = self.mem
        scope = mem.file_scope(workspaces, prefixes)
        out = {}
        for f in file_ids:
            p = mem.file_pos.get(f)
            if p is not None and scope[p] and mem.first_chunk[p] >= 0:
                out[f] = mem.chunk_row(int(mem.first_chunk[p]), 0.0)
        return out

    def shares(
        self,
        weights: dict[str, float],
        file_ids: Sequence[int],
        ids: rank.OpaqueIds | None = None,
        least: float = 0.0,
    ) -> dict[int, float]:
        judged = rank.judged_weights(weights, least)
        files, pos = self.mem.files, self.mem.file_pos
        at = np.asarray([pos.get(f, -1) for f in file_ids], dtype=np.int64)
        held = [files.holds_rows(self.ftid[t], at) for t in judged]
        total = sum(judged.values())
        if total > 0 and (ids is None or not ids.ids):
            # rank.evidence_share for every file at once: the same sum in the same order.
            share = np.zeros(len(file_ids), dtype=np.float64)
            for w, h in zip(judged.values(), held, strict=True):
                share += w * h
            return dict(zip(file_ids, (share / total).tolist(), strict=True))
        return {
            f: rank.evidence_share(
                weights, [t for t, h in zip(judged, held, strict=True) if h[i]], ids, least
            )
            for i, f in enumerate(file_ids)
        }


def _file_ranked(  # noqa: C901 - one pass over the candidates: files, their chunks, vectors, order
    conn: apsw.Connection,
    terms: list[str],
    kept: list[str],
    rare: list[str],
    scope: tuple[str, list[Any]],
    among: np.ndarray | None,
    workspaces: Sequence[str] | None,
    prefixes: Sequence[str] | None,
    limit: int,
    intent: str,
    vec: tuple[Embedder, str, np.ndarray] | None,
    cues: list[str],
    held: _Held | None = None,
    ids: rank.OpaqueIds | None = None,
    named: rank.NamedFiles | None = None,
    command_line: bool = False,
    written: frozenset[str] = frozenset(),
) -> tuple[list[CodeHit], float, float]:
    """(hits, evidence, vec_z): files ranked by code.rank, each answering with its best chunks
    (a file's k-th chunk weighs NEXT_CHUNK_DECAY**k of it); evidence is the best file's
    share of the question (rank.evidence_share) for the relevance floor. ``cues``: the
    words that may name a kind of file (rank.priors_for); ``ids``: the question's
    UUIDs and hashes, each evidence only as a whole (rank.opaque_ids); ``named``: the
    files it names (rank.named_files)."""
    if held is not None:
        weights, n_files = held.file_weights(terms)
        files = held.file_candidates(terms, weights, n_files, workspaces, prefixes, _FILE_POOL)
        rows = held.lexical(kept, rare, workspaces, prefixes, max(limit * 3, _CHUNK_POOL))
    else:
        weights, n_files = _file_weights(conn, terms, workspaces)
        files = _file_candidates(conn, terms, weights, n_files, workspaces, prefixes, _FILE_POOL)
        rows = _lexical(conn, kept, rare, scope, max(limit * 3, _CHUNK_POOL), among, workspaces)
    ev = {f[0]: rank.FileEvidence(f[0], f[1], f[2], file_bm25=f[3]) for f in files}
    by_id: dict[int, tuple[Any, ...]] = {}
    for r in rows:
        by_id.setdefault(r[0], r)
    sims: dict[int, float] = {}
    base = (0.0, 1.0)
    file_of = held.file_of(list(by_id)) if held else _file_of(conn, list(by_id))
    if vec is not None:
        embedder, vtbl, qv = vec
        # The vectors rank their own nearest chunks and each file's best lexical chunk
        # (the rows are in BM25 order): a file's vector signal is its best similarity.
        best_row: dict[int, tuple[Any, ...]] = {}
        for cid, r in by_id.items():
            if cid in file_of:
                best_row.setdefault(file_of[cid], r)
        vec_rows, sims = _vector(
            conn,
            vtbl,
            embedder.dim,
            qv,
            scope,
            max(limit, _VEC_POOL),
            list(best_row.values()),
            _vector_among(conn, workspaces, prefixes, among),
            (lambda ids: held.rows(ids, workspaces, prefixes)) if held else None,
        )
        base = _vec_baseline(conn, vtbl, qv, workspaces)
        new = [r for r in vec_rows if r[0] not in by_id]
        for r in new:
            by_id[r[0]] = (*r[:11], 0.0)
        new_ids = [r[0] for r in new]
        file_of.update(held.file_of(new_ids) if held else _file_of(conn, new_ids))
    per_file: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for cid, r in by_id.items():
        fid = file_of.get(cid)
        if fid is None:
            continue
        e = ev.get(fid)
        if e is None:
            e = ev[fid] = rank.FileEvidence(fid, r[3], r[8])
        e.chunk_bm25 = max(e.chunk_bm25, -float(r[11]))
        e.vector = max(e.vector, sims.get(cid, 0.0))
        per_file[fid].append(r)
    if not ev:
        return [], 0.0, 0.0
    facts = held.file_facts(list(ev)) if held else _file_facts(conn, list(ev))
    for fid, (n, generated, cli, workspace) in facts.items():
        ev[fid].n_chunks = n
        ev[fid].generated = generated
        ev[fid].cli_options = cli
        ev[fid].workspace = workspace
    kinds = {fid: rank.file_kind(e.path, e.language, e.generated) for fid, e in ev.items()}
    priors = rank.priors_for(intent, cues, Counter(kinds.values()))
    defining = _defining(conn, list(ev), written) if written else None
    scores = rank.score_files(
        ev.values(),
        weights,
        priors,
        VEC_WEIGHT if vec is not None else 0.0,
        named,
        command_line,
        defining,
    )
    order = sorted(ev, key=lambda f: (-round(scores[f] * 1e12), ev[f].path))
    # How far each file's best similarity stands out from the question's baseline.
    standout = (
        {f: (e.vector - base[0]) / base[1] for f, e in ev.items() if e.vector > 0}
        if vec is not None
        else {}
    )
    # The question's evidence is the best share among its best files; each file returned
    # must hold a share of its own (HIT_FLOOR), stand out by its vectors (HIT_VEC_Z) or be
    # named by the question. Shares are looked up a block of files at a time, until
    # ``limit`` files pass.
    shares: dict[int, float] = {}
    least = rank.least_weight(n_files)
    passed: list[int] = []
    block = max(limit, _EVIDENCE_FILES)
    for start in range(0, len(order), block):
        part = order[start : start + block]
        shares.update(
            held.shares(weights, part, ids, least)
            if held
            else _shares(conn, weights, part, ids, least)
        )
        passed += [
            f
            for f in part
            # A question of no terms (stopwords alone) is held by every file: no evidence.
            if (terms and shares[f] >= HIT_FLOOR)
            or standout.get(f, 0.0) >= HIT_VEC_Z
            or (named is not None and named.names(ev[f].path, ev[f].workspace))
        ]
        if len(passed) >= limit:
            break
    evidence = max((shares[f] for f in order[:_EVIDENCE_FILES]), default=0.0)
    vec_z = max((standout[f] for f in order[:_EVIDENCE_FILES] if f in standout), default=0.0)
    order = passed
    # Files found by their path alone answer with their first chunk.
    missing = [f for f in order[:limit] if f not in per_file]
    firsts = (
        held.first_chunks(missing, workspaces, prefixes)
        if held
        else _first_chunks(conn, missing, scope)
    )
    for fid, r in firsts.items():
        per_file[fid].append(r)
    # A file the question names with a line ("config.py:445") answers first with the
    # chunk that holds that line, whatever its words.
    lines = (
        [(f, at) for f in order[:limit] if (at := named.line(ev[f].path, ev[f].workspace))]
        if named is not None and named.lines
        else []
    )
    at_line = _chunks_at(conn, lines, scope)
    ranked: list[tuple[float, str, int, tuple[Any, ...], int]] = []
    # The scores of the best ``limit`` chunks so far (a min-heap). No chunk scores above
    # its file, and the files come best first: once the limit-th best chunk scores above
    # the next file, no later file's chunk can take a place.
    best: list[float] = []
    for fid in order:
        if len(best) >= limit and best[0] > round(scores[fid], 6):
            break
        chunks = sorted(
            per_file.get(fid, ()), key=lambda r: (float(r[11]), -sims.get(r[0], 0.0), r[4])
        )
        top = -float(chunks[0][11]) if chunks else 0.0
        if fid in at_line:
            first = next((r for r in chunks if r[0] == at_line[fid][0]), at_line[fid])
            chunks = [first, *(r for r in chunks if r[0] != first[0])]
            top = 0.0  # the named line comes first; the file's other chunks after it
        for k, r in enumerate(chunks[:limit]):
            # A chunk about as good as the file's best keeps about the file's score (the
            # question may be about either); otherwise the k-th weighs DECAY**k of it.
            near = -float(r[11]) / top if top > 0 else 0.0
            factor = max(NEXT_CHUNK_DECAY**k, near * NEXT_CHUNK_DECAY ** (k - 1)) if k else 1.0
            # Ordered by the score as reported (6 decimals), then path and line.
            score = round(scores[fid] * factor, 6)
            if score > 0:
                ranked.append((score, r[3], r[4], r, fid))
                if len(best) < limit:
                    heapq.heappush(best, score)
                elif score > best[0]:
                    heapq.heapreplace(best, score)
    ranked.sort(key=lambda x: (-x[0], x[1], x[2]))
    hits = []
    for score, _, _, r, fid in ranked[:limit]:
        e = ev[fid]
        why = [f"file: {scores[fid]:.2f}"]
        kind = kinds[fid]
        if priors[kind] < 1.0:
            why.append(f"{kind} file: weighs {priors[kind]:g}")
        if command_line and rank.defines_cli(e, kind):
            why.append(f"defines {e.cli_options} command-line options")
        if fid == defining:
            why.append("defines a name the question writes")
        if fid in at_line and r[0] == at_line[fid][0]:
            why.append("at the line the question names")
        if r[0] in sims:
            why.append(f"vec: {sims[r[0]]:.2f}")
        hits.append(_hit(r, score, why, float(r[11]) < 0))
    return hits, evidence, vec_z


def _one_state(
    fn: Callable[Concatenate[apsw.Connection, P], R],
) -> Callable[Concatenate[apsw.Connection, P], R]:
    """``fn`` with the store's state read once for all of the call (``_search_state``)."""

    @functools.wraps(fn)
    def wrapper(conn: apsw.Connection, /, *args: P.args, **kwargs: P.kwargs) -> R:
        token = _search_state.set((conn, _store_state(conn)))
        try:
            return fn(conn, *args, **kwargs)
        finally:
            _search_state.reset(token)

    return wrapper


@_one_state
def search(
    conn: apsw.Connection,
    query: str,
    *,
    embedder: Embedder | None,
    workspaces: Sequence[str] | None = None,
    path_prefixes: Sequence[str] | None = None,
    limit: int = 10,
    mode: str = "hybrid",
    snippet_chars: int = 300,
    freshness: dict[str, Freshness] | None = None,
    describe_hits: bool = True,
    intent: str = "",
) -> CodeSearchResult:
    """Ranked hits for ``query``. With ``describe_hits=False`` they come without snippets
    and "lex:" explanations, for the caller to add to the ones it keeps (``describe``).

    ``lexical`` and ``hybrid`` rank files first (code.rank) and return their best chunks;
    ``intent`` (the router's: find_code, find_knowledge ...; "knowledge" for a knowledge
    question the caller stated, weighed as find_knowledge whatever the question) sets how
    file kinds weigh; a find_knowledge question about code (rank.about_code) is weighed as
    find_code.
    ``vector`` ranks chunks by embedding similarity alone."""
    label, capability, reason, roots = _scope_state(conn, workspaces, embedder)
    empty = CodeSearchResult(label, capability, reason or "", freshness or {}, [])
    if workspaces is not None and not workspaces:
        return empty
    scope = _scope_sql(workspaces, path_prefixes)
    # A path filter keeps few chunks: rank only those, rather than ranking everything and
    # then filtering most of it away (figures in bench/RESULTS.md).
    among = _chunks_under(conn, workspaces, path_prefixes) if path_prefixes else None
    if among is not None and not len(among):
        return empty
    # "fix: ..." and "feat(cli): ...": the change type is not a word to look for, but
    # "test: ..." or "docs: ..." still says which kind of file the change is in.
    change, body = rank.split_change_type(query)
    terms = query_terms(rank.without_line_marks(rank.without_roots(body, roots)))
    # Chunks are indexed by exact words: their stems join the question there ("loaded"
    # finds load_config); the file-level index stems by itself (porter).
    stemmed = rank.with_stems(terms) if mode != "vector" else terms
    # The store's copy in memory (code.memory), when this process holds it for this state.
    mem = memory.ready(conn, _store_state(conn)) if mode != "vector" else None
    kept, rare = _split_terms(conn, stemmed, mem, workspaces)
    # The copy answers when every term is one token to it (a phrase is left to SQL).
    held = _Held.of(mem, terms, kept, workspaces) if mem is not None else None
    if among is not None:
        # Frequent across the index says nothing about the chunks under the prefixes: all
        # terms pick candidates, and only those chunks are scored (knowledge_in_set).
        rare = kept
    elif workspaces is not None and held is None:
        # A few workspaces of a larger store: only their chunks are ranked (the copy in
        # memory ranks only the scope's rows anyway).
        among = _narrow_scope(conn, workspaces)
        if among is not None and not len(among):
            return empty
    vectors = (
        embedder is not None
        and capability == "full"
        and bool(query.strip())
        and mode in ("vector", "hybrid")
    )
    qv = None
    vtbl = None
    if vectors and embedder is not None:
        vtbl = vec_table_for(conn, embedder.identity, embedder.dim, create=False)
        if vtbl is not None:
            qv = embedder.embed_query([body])[0]
            # A query without any embeddable feature has no direction: no vector hits.
            if float(np.linalg.norm(qv)) == 0:
                qv = None
    if mode == "vector":
        rows: list[tuple[Any, ...]] = []
        if qv is not None and vtbl is not None and embedder is not None:
            among = _vector_among(conn, workspaces, path_prefixes, among)
            rows, _ = _vector(conn, vtbl, embedder.dim, qv, scope, limit, among=among)
        hits = [
            _hit(r, 1.0 - float(r[11]), [f"vec: {1.0 - float(r[11]):.2f}"], False) for r in rows
        ]
    else:
        vec = (
            (embedder, vtbl, qv)
            if qv is not None and vtbl is not None and embedder is not None
            else None
        )
        named = rank.named_files(body)
        written = rank.written_identifiers(body)
        # A question the router sent to find_knowledge (no cue words) that reads as being
        # about code ("Fix ...", a `name`, a file) has its files weighed as for find_code.
        if intent == "find_knowledge" and rank.about_code(change, body, written, named):
            intent = "find_code"
        hits, evidence, vec_z = _file_ranked(
            conn,
            terms,
            kept,
            rare,
            scope,
            among,
            workspaces,
            path_prefixes,
            limit,
            intent,
            vec,
            [*terms, change] if change else terms,
            held,
            rank.opaque_ids(body),
            named,
            rank.about_command_line(body),
            written,
        )
        semantic = embedder is not None and not isinstance(embedder, HashingEmbedder)
        # No terms: the words were stopwords alone ("what is this"), and only a semantic
        # embedder's standout could make such a question say something.
        weak = evidence < EVIDENCE_FLOOR or not terms
        if hits and weak and not (semantic and vec_z >= QUESTION_VEC_Z):
            hits = []
    snippet_terms = kept or terms
    # "lex:" names the words a hit contains, stems included (what ranked it).
    terms = stemmed
    if describe_hits:
        hits = describe(conn, hits, terms, snippet_terms, snippet_chars)
    return CodeSearchResult(
        label,
        capability,
        reason or "",
        freshness or {},
        hits,
        terms=tuple(terms),
        snippet_terms=tuple(snippet_terms),
    )


def describe(
    conn: apsw.Connection,
    hits: Sequence[CodeHit],
    terms: Sequence[str],
    snippet_terms: Sequence[str],
    snippet_chars: int,
) -> list[CodeHit]:
    """``hits`` with their snippets and, for lexical hits, the query terms they contain
    ("lex: ..." first in ``why``). The texts are read here, in one query: a search ranks
    more hits than an answer keeps, and tokenising a chunk costs more than ranking it.
    A chunk whose row is gone (a later index run dropped it) keeps an empty snippet."""
    texts = _texts(conn, [h.row_id for h in hits])
    all_terms, centre_on = list(terms), list(snippet_terms)
    mem = memory.held(conn.filename) if conn.filename else None
    ascii_terms = all(t.isascii() for t in all_terms)
    out = []
    for h in hits:
        text = texts.get(h.row_id, "")
        why = list(h.why)
        if h.lexical:
            matched = (
                _held_terms(mem, h, text, all_terms) if mem is not None and ascii_terms else None
            )
            if matched is None:
                matched = matched_terms(text + " " + h.path + " " + h.symbol, all_terms)
            why.insert(0, "lex: " + " ".join(matched))
        out.append(replace(h, why=why, snippet=_snippet(text, centre_on, snippet_chars)))
    return out


def _held_terms(
    mem: memory.StoreMemory, hit: CodeHit, text: str, terms: Sequence[str]
) -> list[str] | None:
    """The ``terms`` among the chunk's full-text tokens, from the store's copy in memory:
    for ASCII text and terms, the same answer as ``matched_terms`` (both are the words'
    identifier parts and joined forms, lower-cased), without reading the text again.
    None when the copy does not hold this chunk with this text, or the text is not ASCII
    (the full-text tokens then drop diacritics, which ``matched_terms`` keeps)."""
    if not (text.isascii() and hit.path.isascii() and hit.symbol.isascii()):
        return None
    held = mem.chunk_tokens.get((hit.row_id, hash((text, hit.path, hit.symbol))))
    if held is None:
        return None
    present = set(np.concatenate(held).tolist())
    vocab = mem.chunks.vocab
    return [t for t in terms if vocab.get(t, -1) in present]


def get_chunk(conn: apsw.Connection, chunk_id: str) -> ChunkRecord | None:
    """A chunk by id, preferring its copy in a current revision."""
    row = conn.execute(
        "SELECT c.chunk_id, c.workspace, c.path, c.start_line, c.end_line, c.source_kind, c.symbol,"
        " c.language, c.content_hash, c.text, coalesce(("
        "  SELECT r.rev FROM rev_file rf JOIN revisions r ON r.id = rf.rev_id"
        "  WHERE rf.file_id = c.file_id ORDER BY (r.id = (SELECT current_rev_id FROM workspaces"
        "  WHERE root = c.workspace)) DESC, r.id DESC LIMIT 1), '') AS rev"
        " FROM chunks c WHERE c.chunk_id = ? ORDER BY rev = '' , c.id DESC LIMIT 1",
        (chunk_id,),
    ).fetchone()
    return None if row is None else ChunkRecord(*row)


_fresh_cache: dict[tuple[str, str], tuple[float, Freshness]] = {}


def check_freshness(
    conn: apsw.Connection,
    root: str,
    *,
    db_key: str = "",
    options: IndexOptions | None = None,
    ttl_s: float = 2.0,
) -> Freshness:
    """Compare file count and newest mtime of the workspace with the current revision.

    Walks with ``stat`` only (no hashing); cached for ``ttl_s`` per workspace."""
    now = time.monotonic()
    key = (db_key, root)
    hit = _fresh_cache.get(key)
    if hit is not None and now - hit[0] < ttl_s:
        return hit[1]
    row = conn.execute(
        "SELECT r.rev, r.walk_count, r.walk_max_mtime_ns FROM workspaces w JOIN revisions r"
        " ON r.id = w.current_rev_id WHERE w.root = ?",
        (root,),
    ).fetchone()
    if row is None:
        fr = Freshness(stale=True, verified_by="mtime", index_rev="", detail="not indexed")
    else:
        o = options or IndexOptions()
        walk = walk_workspace(
            root,
            max_file_bytes=o.max_file_bytes,
            skip_secret_files=o.skip_secret_files,
            extra_ignore=o.extra_ignore,
        )
        count, newest = len(walk.files), walk.max_mtime_ns
        stale = count != row[1] or newest != row[2]
        detail = (
            ""
            if not stale
            else f"files {row[1]} -> {count}"
            if count != row[1]
            else ("a file changed after indexing")
        )
        fr = Freshness(stale=stale, verified_by="mtime", index_rev=row[0], detail=detail)
    _fresh_cache[key] = (now, fr)
    return fr
