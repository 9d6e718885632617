"""The episodes lane database (``episodes.sqlite``): sessions, events, FTS5 index, file state.

Writers hold one connection; readers may open the same file read-only at the same time
(WAL journal). Every file's import is applied in one transaction.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import math
import os
import threading
import time as _time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Self, cast

import apsw
import numpy as np

from knowledge_server import fts
from knowledge_server.fts import compact
from knowledge_server.memo import RevisionMemo
from knowledge_server.schema import (
    Migrations,
    QueryValues,
    Step,
    has_schema,
    immediate,
    int_array,
    one_row,
    open_db,
    snapshot,
)
from knowledge_server.textlang import RU_STEMMER
from knowledge_server.workspaces import stored_cwd, under_sql

from .importers import MAX_NAME, MAX_TITLE, plain_name
from .model import (
    EpisodeHit,
    Event,
    EventDetail,
    EventMeta,
    SessionInfo,
    SessionMeta,
    parse_event_id,
    recent_digests,
)
from .model import event_id as make_event_id
from .text import aux_terms, query_terms

__all__ = ["DB_FILE", "MIGRATIONS", "EpisodeStore", "InvalidQuery"]

DB_FILE = "episodes.sqlite"
LIVE_MINUTES = 10
MAX_QUERY_CHARS = 2000
# A term matching more documents than this is "frequent": see _plan_query.
FREQUENT_MIN_DOCS = 5000
FREQUENT_FRACTION = 0.05
RECENT_CAP = 800
RECENT_MAX_TERMS = 3
# A filtered search first ranks max(k * CAND_FACTOR, CAND_MIN) of the best matches and
# filters them; if fewer than k pass, every match passing the filters is ranked.
CAND_FACTOR = 20
CAND_MIN = 200
# Session filters that leave at most this share of the events are answered from those
# sessions' rowid ranges; wider ones rank the best matches and filter them.
RESTRICTIVE_SHARE = 0.5
# Up to this many ranges are each pushed into FTS5; more are checked per match.
FEW_RANGES = 16
# A frequent-term query ranks every match in a scope's ranges when a scan over them walks
# at most this many rowids (_scanned); more, and it starts from the most recent matches.
RECENT_SPAN = 16_000


class InvalidQuery(ValueError):
    """The query cannot be searched (empty after tokenisation, too long, bad filter)."""


_BASELINE = """
CREATE TABLE sessions (
  session_id TEXT PRIMARY KEY,
  harness TEXT NOT NULL,
  cwd TEXT,
  created_at REAL,
  last_event_at REAL,
  model TEXT,
  agent_preset TEXT,
  title TEXT,
  parent_session_id TEXT,
  agent_id TEXT,
  is_sidechain INTEGER NOT NULL DEFAULT 0,
  subagent_type TEXT,
  spawn_depth INTEGER,
  forked_from_id TEXT,
  outcome TEXT NOT NULL DEFAULT 'unknown',
  persisted INTEGER NOT NULL DEFAULT 1,
  source_path TEXT,
  source_mtime REAL,
  event_count INTEGER NOT NULL DEFAULT 0,
  min_event_id INTEGER,
  max_event_id INTEGER
);
CREATE INDEX sessions_cwd ON sessions(cwd);
CREATE TABLE events (
  id INTEGER PRIMARY KEY,
  session_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event_type TEXT NOT NULL,
  time REAL,
  text TEXT NOT NULL,
  aux TEXT NOT NULL,
  is_error INTEGER NOT NULL DEFAULT 0,
  tool_name TEXT,
  meta TEXT,
  signal TEXT,
  source_path TEXT NOT NULL,
  UNIQUE(session_id, seq)
);
CREATE INDEX events_source ON events(source_path);
CREATE INDEX events_time ON events(time);
CREATE VIRTUAL TABLE events_fts USING fts5(
  text, aux, content='events', content_rowid='id',
  tokenize='unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE events_vocab USING fts5vocab(events_fts, 'row');
CREATE TRIGGER events_ai AFTER INSERT ON events BEGIN
  INSERT INTO events_fts(rowid, text, aux) VALUES (new.id, new.text, new.aux);
END;
CREATE TRIGGER events_ad AFTER DELETE ON events BEGIN
  INSERT INTO events_fts(events_fts, rowid, text, aux) VALUES ('delete', old.id, old.text, old.aux);
END;
CREATE TABLE sources (
  path TEXT PRIMARY KEY,
  format TEXT NOT NULL,
  size INTEGER NOT NULL,
  mtime REAL NOT NULL,
  inode INTEGER,
  offset INTEGER NOT NULL,
  line INTEGER NOT NULL,
  pending_newline INTEGER NOT NULL DEFAULT 0,
  head_len INTEGER NOT NULL,
  head_hash TEXT NOT NULL,
  ctx TEXT,
  sessions TEXT
);
CREATE TABLE lane_meta (key TEXT PRIMARY KEY, value TEXT);
"""

_SESSION_COLS = (
    "session_id, harness, cwd, created_at, model, agent_preset, title, outcome, persisted, parent_session_id, "
    "agent_id, is_sidechain, subagent_type, spawn_depth, forked_from_id, source_path, event_count, "
    "last_event_at, source_mtime, max_event_id"
)
# The same columns read through the alias ``s`` (queries that join sessions to events).
_S_SESSION_COLS = ", ".join("s." + c.strip() for c in _SESSION_COLS.split(","))


_df_memos: dict[str, RevisionMemo[str, int]] = defaultdict(RevisionMemo)
# Session-level scopes per database and index revision (EpisodeStore._scope).
_scope_memos: dict[str, RevisionMemo[tuple[Any, ...], tuple[list[tuple[int, int]] | None, int]]] = (
    defaultdict(lambda: RevisionMemo(cap=1024))
)


def _ts(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt is not None else None


def _dt(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, tz=UTC) if value is not None else None


def _aware(dt: datetime) -> float:
    # Naive datetimes are taken as UTC (every stored time is UTC).
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


# Rowid ranges of running queries: (starts, ends), read by knowledge_in_ranges.
RANGES = QueryValues()


# The events of running queries' workspace scopes (a boolean per event id), read by
# knowledge_in_scope.
SCOPES = QueryValues()


@dataclass(frozen=True, eq=False)  # compared by identity: a mask has no single truth value
class ScopeStats:
    """The events of the sessions under some workspaces, as of one state of the store:
    ``mask[id]`` is true for each, ``rows`` of them holding ``tokens`` tokens in all.

    ``gen`` is the store's ``stats_gen`` (``EpisodeStore._bump_gen``) and ``upto`` the
    highest event id counted: events are only ever added with higher ids between two
    generations, so a newer state extends these by the events past ``upto``. ``history``
    (``EpisodeStore._history``: the store's events up to ``upto``, and which event ``upto``
    is) tells a store that changed under the same generation (an earlier copy restored into
    it with SQLite's backup, or a writer of a version before generations deleting events)."""

    roots: tuple[str, ...]
    gen: str
    upto: int
    mask: np.ndarray
    rows: int
    tokens: int
    history: tuple[int, tuple[Any, ...] | None]

    @functools.cached_property
    def hull(self) -> tuple[int, int]:
        """The lowest and highest event id in the scope ((1, 0) for none): a term's
        matches outside them need not be read to count the scope's."""
        return _hull(self.mask)


# Per database file and workspace roots, the newest ScopeStats counted in this process.
_scope_stats: dict[tuple[str, tuple[str, ...]], ScopeStats] = {}
_scope_stats_lock = threading.Lock()
SCOPE_STATS_CAP = 64
# Per database file and index revision: the events of a scope that session-level filters
# keep (EpisodeStore._filter_mask); a byte per event id each, and callers choose the
# filters, so few are kept.
FILTER_MASKS_CAP = 32
_filter_memos: dict[str, RevisionMemo[tuple[Any, ...], np.ndarray]] = defaultdict(
    lambda: RevisionMemo(cap=FILTER_MASKS_CAP)
)
# Per database file, generation, scope roots and phrase: (upto, the scope's events up to
# that id holding the phrase), extended by the events added since.
_scope_hits: dict[tuple[str, str, tuple[str, ...], str], tuple[int, int]] = {}
SCOPE_HITS_CAP = 50_000


@dataclass(frozen=True)
class _Filter:
    """A search's session-level filters and time window, and the SQL conditions and
    arguments ``EpisodeStore._filters`` made of them (``conds``, ``args``)."""

    session_ids: Sequence[str] | None
    since: datetime | None
    until: datetime | None
    outcome: str
    conds: list[str]
    args: list[Any]

    @property
    def session_level(self) -> bool:
        """Whether it keeps some sessions only (by id or outcome)."""
        return self.session_ids is not None or self.outcome not in ("any", "", None)

    @property
    def windowed(self) -> bool:
        """Whether it keeps a time window only."""
        return self.since is not None or self.until is not None


@dataclass(frozen=True)
class _Head:
    """The statement part selecting a query's matches (``rid``) and their scores
    (``score``, lower is better), up to its FTS5 condition, and its parameters: FTS5's
    bm25() over every event, or, in a workspace scope, ``knowledge_bm25`` with the scope's
    statistics, and ``check`` keeping only the scope's events (``knowledge_in_scope``)."""

    sql: str
    args: tuple[Any, ...]
    # The scope's condition and its parameter, written after every cheaper one (SQLite
    # checks a match against them in that order, and this one is a Python call).
    check: str = ""
    check_args: tuple[Any, ...] = ()

    @classmethod
    def of(cls, match: str) -> _Head:
        sql = "SELECT rowid AS rid, bm25(events_fts) AS score FROM events_fts WHERE events_fts MATCH ?"
        return cls(sql, (match,))

    @classmethod
    def scoped(cls, match: str, stats: ScopeStats, idf: Sequence[float], token: int) -> _Head:
        # Both columns weigh 1, as in bm25(events_fts).
        score, sargs = fts.scoped_score("events_fts", stats.rows, stats.tokens, (1.0, 1.0), idf)
        sql = f"SELECT rowid AS rid, {score} AS score FROM events_fts WHERE events_fts MATCH ?"  # noqa: S608 - constant SQL fragments only, values bound
        return cls(sql, (*sargs, match), " AND knowledge_in_scope(rowid, ?)", (token,))


def _tail(conds: list[str]) -> str:
    """The end of a search statement after its ``WITH m AS (`` matches: join them to their
    events and sessions, apply ``conds``, rank and cut to k (``?``) on narrow rows first;
    texts are read for the hits kept (``describe``)."""
    where = (" WHERE " + " AND ".join(conds)) if conds else ""
    cols = "f.id, e.session_id, e.seq, e.event_type, e.time, e.tool_name, e.is_error, f.score"
    narrow = "e.id AS id, m.score AS score, e.time AS t, e.session_id AS sid, e.seq AS seq"
    return (
        f"), f AS (SELECT {narrow} FROM m JOIN events e ON e.id = m.rid "  # noqa: S608 - conditions made here of constants and placeholders, values bound
        f"JOIN sessions s ON s.session_id = e.session_id{where}"
        " ORDER BY m.score ASC, e.time DESC, e.session_id ASC, e.seq ASC LIMIT ?) "
        f"SELECT {cols} FROM f JOIN events e ON e.id = f.id "
        "ORDER BY f.score ASC, f.t DESC, f.sid ASC, f.seq ASC"
    )


def _hull(mask: np.ndarray) -> tuple[int, int]:
    """The lowest and highest id set in ``mask`` ((1, 0) for none)."""
    ids = np.flatnonzero(mask)
    return (int(ids[0]), int(ids[-1])) if len(ids) else (1, 0)


def _id_array(ids: str | None) -> np.ndarray:
    """Event ids from SQL ``group_concat(id)`` (one string: much faster to read than a row
    per id)."""
    if not ids:
        return np.zeros(0, dtype=np.int64)
    return np.fromstring(ids, dtype=np.int64, sep=",")


def _any_column(term: str) -> str:
    """The FTS5 phrase of ``term`` in any column: the events fts5vocab counts for it."""
    return '"' + term.replace('"', '""') + '"'


def _in_scope(rowid: int, token: int) -> int:
    """SQL ``knowledge_in_scope(rowid, token)``: whether event ``rowid`` is one of the
    scope's held under ``token`` (a ``ScopeStats.mask``)."""
    mask: np.ndarray = SCOPES[token]  # type: ignore[assignment]
    return int(rowid < len(mask) and bool(mask[rowid]))


def _scanned(ranges: Sequence[tuple[int, int]]) -> int:
    """Rowids an FTS scan over ``ranges`` walks (``EpisodeStore._in_ranges``): each range
    when they are few, else their hull."""
    if len(ranges) <= FEW_RANGES:
        return sum(hi - lo + 1 for lo, hi in ranges)
    return ranges[-1][1] - ranges[0][0] + 1


def _time_conds(
    since: datetime | None, until: datetime | None, column: str = "time"
) -> tuple[list[str], list[float]]:
    """SQL conditions keeping the events (``column``) in the time window, inclusive."""
    conds, args = [], []
    if since is not None:
        conds.append(f"{column} >= ?")
        args.append(_aware(since))
    if until is not None:
        conds.append(f"{column} <= ?")
        args.append(_aware(until))
    return conds, args


def _window_sql(since: datetime | None, until: datetime | None) -> tuple[str, list[float]]:
    """An FTS5 condition keeping the matches whose event lies in the time window ("" for
    no window). ``+rowid`` keeps SQLite from handing the list to FTS5 as rowids to seek
    one by one: it checks each match against the window's event ids instead."""
    conds, args = _time_conds(since, until)
    if not conds:
        return "", []
    return f" AND +rowid IN (SELECT id FROM events WHERE {' AND '.join(conds)})", args  # noqa: S608 - conditions made here of constants and placeholders, values bound


def _in_ranges(rowid: int, token: int) -> int:
    """SQL ``knowledge_in_ranges(rowid, token)``: whether ``rowid`` lies in one of the
    sorted, disjoint ranges held under ``token``."""
    starts, ends = cast(tuple[list[int], list[int]], RANGES[token])
    i = bisect.bisect_right(starts, rowid) - 1
    return int(i >= 0 and rowid <= ends[i])


class EpisodeStore:
    """Open (and create) ``episodes.sqlite``. ``read_only=True`` never writes."""

    BUSY_MS = 5000  # how long the connection waits for another one's lock

    def __init__(
        self, path: str, *, read_only: bool = False, live_minutes: int = LIVE_MINUTES
    ) -> None:
        if os.path.isdir(path):
            path = os.path.join(path, DB_FILE)
        self.path = path
        self.read_only = read_only
        self.live_minutes = live_minutes
        self.conn = open_db(path, MIGRATIONS, read_only=read_only, busy_ms=self.BUSY_MS)
        # Typed by what the queries pass them: a rowid and a token.
        self.conn.create_scalar_function(
            "knowledge_in_ranges", cast("apsw.ScalarProtocol", _in_ranges), 2
        )
        self.conn.create_scalar_function(
            "knowledge_in_scope", cast("apsw.ScalarProtocol", _in_scope), 2
        )
        fts.register_scoped_bm25(self.conn)
        self._tokens = fts.tokenizer(self.conn, "unicode61", ["remove_diacritics", "2"])
        if not read_only:
            self._restem()

    def _restem(self) -> None:
        """When the Russian stemmer changed since the events were stored (the key is absent
        in stores written with the hand-written one before it): recompute the ``aux`` terms
        of every event whose text has them and re-index those rows, in a new index revision.

        Not a schema migration: the stems depend on the installed stemmer's version, so a
        new release of it re-derives them too."""
        current = "SELECT value FROM lane_meta WHERE key = 'aux_stemmer'"
        row = self.conn.execute(current).fetchone()
        if row and row[0] == RU_STEMMER:
            return
        with immediate(self.conn):
            cur = self.conn.cursor()
            row = cur.execute(current).fetchone()
            if row and row[0] == RU_STEMMER:  # another writer got here first
                return
            changed = []
            for rowid, text, aux in cur.execute("SELECT id, text, aux FROM events WHERE aux != ''"):
                new = aux_terms(text)
                if new != aux:
                    changed.append((rowid, text, aux, new))
            for rowid, text, aux, new in changed:
                # The index keeps no copy of its content: delete the row with the terms it
                # was indexed with, then index it again with the new ones.
                cur.execute(
                    "INSERT INTO events_fts(events_fts, rowid, text, aux) VALUES ('delete', ?, ?, ?)",
                    (rowid, text, aux),
                )
                cur.execute("UPDATE events SET aux = ? WHERE id = ?", (new, rowid))
                cur.execute(
                    "INSERT INTO events_fts(rowid, text, aux) VALUES (?, ?, ?)", (rowid, text, new)
                )
            if changed:
                self._bump_rev(cur)
                self._bump_gen(cur)
            cur.execute(
                "INSERT OR REPLACE INTO lane_meta(key, value) VALUES ('aux_stemmer', ?)",
                (RU_STEMMER,),
            )

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ file state
    def session_cwds(self, session_ids: Iterable[str]) -> dict[str, str | None]:
        """The stored ``cwd`` of each of ``session_ids`` that already has a session row
        (the first writer's: ``_merge_session`` never replaces a stored cwd)."""
        return {sid: cwd for sid, (cwd, _source) in self.session_owners(session_ids).items()}

    def session_owners(
        self, session_ids: Iterable[str]
    ) -> dict[str, tuple[str | None, str | None]]:
        """The stored ``cwd`` and first ``source_path`` of each of ``session_ids`` that
        already has a session row (both the first writer's)."""
        out: dict[str, tuple[str | None, str | None]] = {}
        ids = sorted(set(session_ids))
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            marks = ",".join("?" * len(part))
            for sid, cwd, source in self.conn.execute(
                f"SELECT session_id, cwd, source_path FROM sessions WHERE session_id IN ({marks})",  # noqa: S608 - only placeholders are formatted in, values bound
                part,
            ):
                out[sid] = (cwd, source)
        return out

    def source_state(self, path: str) -> dict[str, Any] | None:
        row = self.conn.execute(
            "SELECT format, size, mtime, inode, offset, line, pending_newline, head_len, head_hash, ctx, sessions "
            "FROM sources WHERE path = ?",
            (path,),
        ).fetchone()
        if row is None:
            return None
        keys = (
            "format",
            "size",
            "mtime",
            "inode",
            "offset",
            "line",
            "pending_newline",
            "head_len",
            "head_hash",
            "ctx",
            "sessions",
        )
        st = dict(zip(keys, row, strict=True))
        st["ctx"] = json.loads(st["ctx"]) if st["ctx"] else {}
        st["sessions"] = json.loads(st["sessions"]) if st["sessions"] else []
        return st

    def apply_file(
        self,
        path: str,
        fmt: str,
        *,
        reset: bool,
        events: Sequence[Event],
        sessions: dict[str, SessionMeta],
        state: dict[str, Any],
    ) -> tuple[int, int, list[str]]:
        """Write one file's import in a single transaction.

        ``reset`` deletes the events previously imported from ``path`` first (truncation,
        rotation or a whole-file format). Returns (added, duplicates, touched session ids).
        """
        added = dup = 0
        dup_keys: list[tuple[str, int]] = []
        with self.conn:
            cur = self.conn.cursor()
            old_sessions: list[str] = []
            if reset:
                prev = self.source_state(path)
                old_sessions = prev["sessions"] if prev else []
                cur.execute("DELETE FROM events WHERE source_path = ?", (path,))
                if self.conn.changes():
                    self._bump_gen(cur)
            for meta in sessions.values():
                self._merge_session(cur, meta, state.get("mtime"))
            for ev in events:
                cur.execute(
                    "INSERT INTO events(session_id, seq, event_type, time, text, aux, is_error, tool_name, meta, "
                    "signal, source_path) VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(session_id, seq) DO NOTHING",
                    (
                        ev.session_id,
                        ev.seq,
                        ev.event_type,
                        _ts(ev.time),
                        ev.text,
                        aux_terms(ev.text),
                        int(ev.is_error),
                        ev.tool_name,
                        json.dumps(ev.meta, ensure_ascii=False) if ev.meta else None,
                        ev.signal,
                        path,
                    ),
                )
                if self.conn.changes():
                    added += 1
                else:
                    dup += 1
                    dup_keys.append((ev.session_id, ev.seq))
            self._adopt_moved(cur, path, dup_keys)
            touched = sorted(set(sessions) | {e.session_id for e in events} | set(old_sessions))
            for sid in touched:
                self._refresh_session(cur, sid)
            all_sessions = sorted(
                set(state.get("sessions_prev") or [])
                | set(sessions)
                | {e.session_id for e in events}
            )
            cur.execute(
                "INSERT INTO sources(path, format, size, mtime, inode, offset, line, pending_newline, head_len, "
                "head_hash, ctx, sessions) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(path) DO UPDATE SET "
                "format=excluded.format, size=excluded.size, mtime=excluded.mtime, inode=excluded.inode, "
                "offset=excluded.offset, line=excluded.line, pending_newline=excluded.pending_newline, "
                "head_len=excluded.head_len, head_hash=excluded.head_hash, ctx=excluded.ctx, sessions=excluded.sessions",
                (
                    path,
                    fmt,
                    state["size"],
                    state["mtime"],
                    state.get("inode"),
                    state["offset"],
                    state["line"],
                    int(state.get("pending_newline", False)),
                    state["head_len"],
                    state["head_hash"],
                    json.dumps(state.get("ctx") or {}, ensure_ascii=False),
                    json.dumps(all_sessions),
                ),
            )
            if added or reset or sessions:
                self._bump_rev(cur)
        return added, dup, touched

    def _adopt_moved(self, cur: apsw.Cursor, path: str, keys: list[tuple[str, int]]) -> None:
        """Events this file brings that are stored already from a file that no longer
        exists are this file's now: the log was moved (Codex archives a rollout into
        ``archived_sessions/``, a project folder is renamed). Left to the old path, they
        were deleted with it once its absence was noticed, and the new file, recorded as
        read, never brought them back."""
        owners: dict[str, list[tuple[Any, Any]]] = {}
        for i in range(0, len(keys), 400):
            part = keys[i : i + 400]
            marks = ",".join("(?,?)" for _ in part)
            for sid, seq, source in cur.execute(
                f"SELECT session_id, seq, source_path FROM events WHERE (session_id, seq) IN (VALUES {marks})",  # noqa: S608 - only placeholders are formatted in, values bound
                [v for key in part for v in key],
            ).fetchall():
                if source != path:
                    owners.setdefault(str(source), []).append((sid, seq))
        for source, moved in owners.items():
            if os.path.lexists(source):
                continue  # another live file holds them (a duplicate, not a move)
            cur.executemany(
                "UPDATE events SET source_path = ? WHERE session_id = ? AND seq = ? AND source_path = ?",
                [(path, sid, seq, source) for sid, seq in moved],
            )
            cur.execute("UPDATE sessions SET source_path = ? WHERE source_path = ?", (path, source))

    def _merge_session(self, cur: apsw.Cursor, m: SessionMeta, mtime: float | None) -> None:
        # First writer wins for identity fields (cwd, created_at keeps the minimum); later
        # chunks may fill gaps and update the model (the most recent one is the current).
        cwd = stored_cwd(m.cwd)
        if cwd is not None:
            known = cur.execute(
                "SELECT cwd FROM sessions WHERE session_id = ?", (m.session_id,)
            ).fetchone()
            if known is not None and known[0] is None:
                self._bump_gen(cur)  # the session's stored events enter workspaces' scopes
        cur.execute(
            "INSERT INTO sessions(session_id, harness, cwd, created_at, model, agent_preset, title, "
            "parent_session_id, agent_id, is_sidechain, subagent_type, spawn_depth, forked_from_id, persisted, "
            "source_path, source_mtime) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT(session_id) DO UPDATE SET "
            "cwd = COALESCE(sessions.cwd, excluded.cwd), "
            "created_at = MIN(COALESCE(sessions.created_at, excluded.created_at), "
            "COALESCE(excluded.created_at, sessions.created_at)), "
            "model = COALESCE(excluded.model, sessions.model), "
            "agent_preset = COALESCE(excluded.agent_preset, sessions.agent_preset), "
            "title = COALESCE(excluded.title, sessions.title), "
            "parent_session_id = COALESCE(sessions.parent_session_id, excluded.parent_session_id), "
            "agent_id = COALESCE(sessions.agent_id, excluded.agent_id), "
            "is_sidechain = MAX(sessions.is_sidechain, excluded.is_sidechain), "
            "subagent_type = COALESCE(excluded.subagent_type, sessions.subagent_type), "
            "spawn_depth = COALESCE(excluded.spawn_depth, sessions.spawn_depth), "
            "forked_from_id = COALESCE(sessions.forked_from_id, excluded.forked_from_id), "
            "source_path = COALESCE(sessions.source_path, excluded.source_path), "
            "source_mtime = MAX(COALESCE(sessions.source_mtime, 0), COALESCE(excluded.source_mtime, 0))",
            (
                m.session_id,
                m.harness,
                cwd,
                _ts(m.created_at),
                m.model,
                m.agent_preset,
                m.title,
                m.parent_session_id,
                m.agent_id,
                int(m.is_sidechain),
                m.subagent_type,
                m.spawn_depth,
                m.forked_from_id,
                int(m.persisted),
                m.source_path,
                mtime,
            ),
        )

    def _refresh_session(self, cur: apsw.Cursor, sid: str) -> None:
        """Recompute counts and the outcome (rule documented in docs/episodes.md)."""
        count, last, lo, hi = one_row(
            cur,
            "SELECT COUNT(*), MAX(time), MIN(id), MAX(id) FROM events WHERE session_id = ?",
            (sid,),
        )
        row = cur.execute(
            "SELECT signal FROM events WHERE session_id = ? AND signal IS NOT NULL ORDER BY seq DESC LIMIT 1",
            (sid,),
        ).fetchone()
        if row:
            outcome = row[0]
        else:
            tail = cur.execute(
                "SELECT event_type, is_error FROM events WHERE session_id = ? AND event_type NOT IN "
                "('system', 'summary', 'reasoning') ORDER BY seq DESC LIMIT 1",
                (sid,),
            ).fetchone()
            if tail is None:
                outcome = "unknown"
            elif tail[1]:
                outcome = "failure"
            elif tail[0] == "assistant/message":
                outcome = "success"
            else:
                outcome = "unknown"
        cur.execute(
            "UPDATE sessions SET event_count = ?, last_event_at = ?, outcome = ?, min_event_id = ?, "
            "max_event_id = ? WHERE session_id = ?",
            (count, last, outcome, lo, hi, sid),
        )

    @staticmethod
    def _bump_rev(cur: apsw.Cursor) -> None:
        row = cur.execute("SELECT value FROM lane_meta WHERE key = 'rev_counter'").fetchone()
        counter = int(row[0]) + 1 if row else 1
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        cur.execute(
            "INSERT OR REPLACE INTO lane_meta(key, value) VALUES ('rev_counter', ?)",
            (str(counter),),
        )
        cur.execute(
            "INSERT OR REPLACE INTO lane_meta(key, value) VALUES ('index_rev', ?)",
            (f"episodes:{now}:{counter}",),
        )

    @staticmethod
    def _bump_gen(cur: apsw.Cursor) -> None:
        """A write that changes stored events other than by adding new ones (deletes them,
        re-indexes them, or moves a session's into workspaces by filling its cwd): the
        scopes' statistics (``_scope_stats``) are counted again rather than extended. The
        generation is random, never a count: a store made again at the same path cannot
        meet a generation remembered from another store. (An earlier copy of the same
        store restored into it keeps its generation: ``ScopeStats.history`` tells it.)"""
        cur.execute(
            "INSERT OR REPLACE INTO lane_meta(key, value) VALUES ('stats_gen', ?)",
            (uuid.uuid4().hex,),
        )

    def compact_fts(self, changed_rows: int) -> bool:
        """After a write run that changed ``changed_rows`` events: merge the text index's
        segments when the run changed a sizeable share, or they piled up (``fts.compact``)."""
        return compact(
            self.conn, "events_fts", changed_rows=changed_rows, total_rows=self._doc_count()
        )

    def index_rev(self) -> str:
        row = self.conn.execute("SELECT value FROM lane_meta WHERE key = 'index_rev'").fetchone()
        return row[0] if row else "episodes:empty:0"

    def source_paths(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT path FROM sources ORDER BY path")]

    def forget_source(self, path: str) -> int:
        """Remove a file's events (e.g. it was deleted). Returns how many were removed."""
        with self.conn:
            cur = self.conn.cursor()
            st = self.source_state(path)
            cur.execute("DELETE FROM events WHERE source_path = ?", (path,))
            n = self.conn.changes()
            cur.execute("DELETE FROM sources WHERE path = ?", (path,))
            for sid in (st or {}).get("sessions", []):
                self._refresh_session(cur, sid)
            if n:
                self._bump_rev(cur)
                self._bump_gen(cur)
        return n

    # ------------------------------------------------------------------ reading
    def _session_from_row(self, r: Sequence[Any], now: float) -> SessionInfo:
        mtime = r[18]
        live = (not bool(r[8])) or (mtime is not None and now - mtime < self.live_minutes * 60)
        return SessionInfo(
            session_id=r[0],
            harness=r[1],
            cwd=r[2],
            created_at=_dt(r[3]),
            model=r[4],
            agent_preset=r[5],
            title=r[6],
            outcome=r[7],
            persisted=bool(r[8]),
            live=live,
            parent_session_id=r[9],
            agent_id=r[10],
            is_sidechain=bool(r[11]),
            subagent_type=r[12],
            spawn_depth=r[13],
            forked_from_id=r[14],
            source_path=r[15],
            event_count=r[16] or 0,
            last_event_at=_dt(r[17]),
            max_event_id=r[19],
        )

    def _filters(
        self,
        workspaces: Sequence[str] | None,
        session_ids: Sequence[str] | None,
        since: datetime | None,
        until: datetime | None,
        outcome: str,
        s_alias: str = "s",
        e_alias: str | None = "e",
    ) -> tuple[list[str], list[Any]] | None:
        """SQL conditions for the filters; None means "matches nothing"."""
        conds: list[str] = []
        args: list[Any] = []
        if workspaces is not None:
            roots = [os.path.normpath(w) for w in workspaces if w]
            if not roots:
                return None
            cond, cond_args = under_sql(f"{s_alias}.cwd", roots)
            conds.append(cond)
            args.extend(cond_args)
        if session_ids is not None:
            ids = list(session_ids)
            if not ids:
                return None
            conds.append(f"{s_alias}.session_id IN ({','.join('?' * len(ids))})")
            args.extend(ids)
        if outcome not in ("any", "", None):
            if outcome not in ("success", "failure", "unknown"):
                raise InvalidQuery("outcome must be success, failure, unknown or any")
            conds.append(f"{s_alias}.outcome = ?")
            args.append(outcome)
        if e_alias:
            time_conds, time_args = _time_conds(since, until, f"{e_alias}.time")
            conds.extend(time_conds)
            args.extend(time_args)
        return conds, args

    def _doc_count(self) -> int:
        return int(one_row(self.conn, "SELECT MAX(id) FROM events")[0] or 0)

    def _doc_freqs(self, terms: list[str]) -> dict[str, int]:
        """Events containing each term. fts5vocab counts them by walking the term's posting
        list, long for a common word; the counts are remembered per database and index
        revision, as queries repeat words."""
        name = self.conn.filename  # in-memory databases all have the name "": not remembered
        known = _df_memos[name].at(self.index_rev()) if name else {}
        for term in terms:
            if term not in known:
                row = self.conn.execute(
                    "SELECT doc FROM events_vocab WHERE term = ?", (term,)
                ).fetchone()
                known[term] = int(row[0]) if row else 0
        return {t: known[t] for t in terms}

    def _totals(self) -> tuple[int, int]:
        """(events, their tokens) the text index holds (its averages record: exact, and
        one read)."""
        row = self.conn.execute("SELECT block FROM events_fts_data WHERE id = 1").fetchone()
        return fts.totals(row[0] if row else None)

    def _scope_stats(self, roots: Sequence[str]) -> ScopeStats:
        """The statistics of the events of the sessions under ``roots`` (normalised). Also
        when those are every event the store holds: the numbers are then the whole index's,
        but ranking as an unscoped search does would choose among equal scores differently,
        so the arrival of another workspace's first event would change the answer.

        Remembered per database and roots in this process, and extended by the events
        added since, as long as no write changed stored events (``_bump_gen``) and the
        store still holds what was counted (``_history``)."""
        key = tuple(sorted(set(roots)))
        gen, top = one_row(
            self.conn,
            "SELECT (SELECT value FROM lane_meta WHERE key = 'stats_gen'), "
            "(SELECT MAX(id) FROM events)",
        )
        gen, top = str(gen or 0), int(top or 0)
        name = self.conn.filename  # in-memory databases all have the name "": not remembered
        with _scope_stats_lock:
            old = _scope_stats.get((name, key)) if name else None
        if (
            old is None
            or old.gen != gen
            or old.upto > top
            or old.history != self._history(old.upto)
        ):
            old = None
        stats = (
            old if old is not None and old.upto == top else self._count_scope(key, gen, top, old)
        )
        if name and stats is not old:
            with _scope_stats_lock:
                if len(_scope_stats) >= SCOPE_STATS_CAP:
                    _scope_stats.clear()
                _scope_stats[(name, key)] = stats
        return stats

    def _count_scope(
        self, roots: tuple[str, ...], gen: str, top: int, old: ScopeStats | None
    ) -> ScopeStats:
        """``old`` extended by the scope's events with ids in (old.upto, top], or counted
        from scratch without one."""
        cond, args = under_sql("s.cwd", list(roots))
        if old is None:
            inside = one_row(
                self.conn,
                f"SELECT COALESCE(SUM(s.event_count), 0) FROM sessions s WHERE {cond}",  # noqa: S608 - conditions made here of constants and placeholders, values bound
                args,
            )[0]
            rows, tokens = self._totals()
            if 2 * inside > rows:
                # Most of the store: the index's totals less the events outside, whose
                # lengths are fewer to read (a Python call each).
                ids, out = self._scope_events(f"(s.cwd IS NULL OR NOT {cond})", args, 0, top, False)
                mask = np.ones(top + 1, dtype=bool)
                mask[0] = False
                mask[ids] = False
                history = self._history(top)
                return ScopeStats(roots, gen, top, mask, rows - len(ids), tokens - out, history)
        lo = old.upto if old is not None else 0
        ids, tokens = self._scope_events(cond, args, lo, top, old is not None)
        mask = np.zeros(top + 1, dtype=bool)
        if old is not None:
            mask[: len(old.mask)] = old.mask
        mask[ids] = True
        rows = (old.rows if old is not None else 0) + len(ids)
        tokens += old.tokens if old is not None else 0
        return ScopeStats(roots, gen, top, mask, rows, tokens, self._history(top))

    def _history(self, upto: int) -> tuple[int, tuple[Any, ...] | None]:
        """(the events with ids up to ``upto``, the session and seq of event ``upto``): what
        a ``ScopeStats`` counted up to ``upto`` remembers, to check that the store still
        holds those events before extending it (three lookups)."""
        newer = one_row(self.conn, "SELECT COUNT(*) FROM events WHERE id > ?", (upto,))
        last = self.conn.execute(
            "SELECT session_id, seq FROM events WHERE id = ?", (upto,)
        ).fetchone()
        return self._totals()[0] - int(newer[0]), tuple(last) if last else None

    def _scope_events(
        self, cond: str, args: Sequence[Any], lo: int, top: int, new: bool, tokens: bool = True
    ) -> tuple[np.ndarray, int]:
        """(ids, tokens in all, or 0 without ``tokens``) of the events with ids in (lo, top]
        of the sessions ``cond`` keeps. ``new``: a few new events, each looked up in
        sessions; else the sessions first, then their events (an index on session_id; the
        planner would rather scan every event, and the unary + keeps the id bounds from
        driving one)."""
        joined, ids_in = (
            ("events e CROSS JOIN sessions s ON s.session_id = e.session_id", "e.id")
            if new
            else ("sessions s CROSS JOIN events e ON e.session_id = s.session_id", "+e.id")
        )
        summed, sizes = (
            (
                "COALESCE(SUM(knowledge_docsize(d.sz)), 0)",
                " JOIN events_fts_docsize d ON d.id = e.id",
            )
            if tokens
            else ("0", "")
        )
        ids, total = one_row(
            self.conn,
            f"SELECT group_concat(e.id), {summed} FROM {joined}{sizes} "  # noqa: S608 - conditions made here of constants and placeholders, values bound
            f"WHERE {ids_in} > ? AND {ids_in} <= ? AND {cond}",
            [lo, top, *args],
        )
        return _id_array(ids), int(total)

    def _hits_in(self, stats: ScopeStats, phrase: str) -> int:
        """Events of the scope matching the FTS5 expression ``phrase``: counted from its
        matches in the scope's id range, read as one string and checked against its mask;
        remembered per database, generation and scope, and extended by the matches past
        the ids counted before."""
        name = self.conn.filename  # in-memory databases all have the name "": not remembered
        key = (name, stats.gen, stats.roots, phrase)
        upto, hits = _scope_hits.get(key, (0, 0)) if name else (0, 0)
        if upto > stats.upto:  # a newer state than this snapshot's: count afresh
            upto, hits = 0, 0
        if upto < stats.upto:
            lo, hi = stats.hull
            row = one_row(
                self.conn,
                "SELECT group_concat(rowid) FROM events_fts WHERE events_fts MATCH ? "
                "AND rowid BETWEEN ? AND ?",
                (phrase, max(lo, upto + 1), min(hi, stats.upto)),
            )
            hits += int(stats.mask[_id_array(row[0])].sum())
            if name:
                if len(_scope_hits) >= SCOPE_HITS_CAP:
                    _scope_hits.clear()
                _scope_hits[key] = (stats.upto, hits)
        return hits

    def _plan_query(
        self, query: str, stats: ScopeStats | None = None
    ) -> tuple[str, bool, list[str], list[str]]:
        """Build the FTS5 expression. Returns (match, recent_only, snippet needles, the
        match's phrases in order).

        Stop-words are dropped when other words remain. A term present in more than
        max(FREQUENT_MIN_DOCS, 5%) of the events is dropped too when a rarer term exists;
        a query made only of such terms is answered from the RECENT_CAP most recent matches
        (FTS5 can walk a term's rowids backwards without scoring every match). With
        ``stats``, the events and frequencies counted are the scope's.
        """
        if "\x00" in query:
            query = query.replace("\x00", " ")
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidQuery(f"query longer than {MAX_QUERY_CHARS} characters")
        terms = query_terms(query)
        if not terms:
            raise InvalidQuery("query has no searchable words")
        content = [t for t in terms if not t.stop] or terms
        n_docs = self._totals()[0] if stats is None else stats.rows
        limit = max(FREQUENT_MIN_DOCS, int(n_docs * FREQUENT_FRACTION))
        recent_only = False
        if n_docs > limit:
            if stats is None:
                freq = self._doc_freqs([t.term for t in content])
                dfs = {t.key(): freq[t.term] for t in content}
            else:
                # What fts5vocab counts for a term, in the scope: the events holding it as
                # one token (none when the tokenizer makes it into others, "a_b" or "é").
                dfs = {
                    t.key(): self._hits_in(stats, _any_column(t.term))
                    if self._tokens(t.term, False) == [t.term]
                    else 0
                    for t in content
                }
            rare = [t for t in content if dfs[t.key()] <= limit]
            if rare:
                content = rare
            else:
                recent_only = True
                content = sorted(content, key=lambda t: dfs[t.key()])[:RECENT_MAX_TERMS]
        phrases = [t.fts() for t in content[:64]]
        return " OR ".join(phrases), recent_only, [t.needle for t in terms], phrases

    def search(
        self,
        query: str,
        *,
        k: int = 10,
        workspaces: Sequence[str] | None = None,
        session_ids: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        outcome: str = "any",
        snippet_chars: int = 240,
    ) -> list[EpisodeHit]:
        """BM25 search over event text; literal query, filters applied in SQL."""
        hits, needles = self.search_ranked(
            query,
            k=k,
            workspaces=workspaces,
            session_ids=session_ids,
            since=since,
            until=until,
            outcome=outcome,
        )
        return self.describe(hits, needles, snippet_chars)

    def search_ranked(
        self,
        query: str,
        *,
        k: int = 10,
        workspaces: Sequence[str] | None = None,
        session_ids: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        outcome: str = "any",
    ) -> tuple[list[EpisodeHit], list[str]]:
        """``search`` without snippets and sessions: (hits, the needles snippets centre on).
        ``describe`` adds them to the hits a caller keeps."""
        if not isinstance(query, str):
            raise InvalidQuery("query must be a string")
        k = max(1, min(int(k), 500))
        flt = self._filters(workspaces, session_ids, since, until, outcome)
        if flt is None:
            return [], []
        filters = _Filter(session_ids, since, until, outcome, *flt)
        if workspaces is not None:
            roots = tuple(sorted({os.path.normpath(w) for w in workspaces if w}))
            with snapshot(self.conn):  # the statistics and the ranking see one state
                stats = self._scope_stats(roots)
                return self._ranked_in_scope(query, stats, k, filters)
        return self._ranked(query, k, filters)

    def _ranked(self, query: str, k: int, filters: _Filter) -> tuple[list[EpisodeHit], list[str]]:
        """``search_ranked`` without workspaces, with the whole store's statistics."""
        match, recent_only, needles, _ = self._plan_query(query)
        head = _Head.of(match)
        tail = _tail(filters.conds)
        # bm25() is what `rank` computes, but as an expression SQLite's sorter keeps only
        # the best LIMIT rows, where `ORDER BY rank` has FTS5 sort every match (slower);
        # ties go to the newer event, as in the final order.
        inner_order = "ORDER BY rowid DESC" if recent_only else "ORDER BY score, rowid DESC"
        filtered = bool(filters.conds)
        cand = RECENT_CAP if recent_only else (max(k * CAND_FACTOR, CAND_MIN) if filtered else k)
        if filters.windowed and not self._has_events(filters.since, filters.until):
            return [], needles  # no event at all in the time window
        ranges = None
        session_level = filters.session_level
        if session_level:
            ranges, allowed = self._scope(None, filters.session_ids, filters.outcome)
            if allowed == 0:
                return [], needles
            if not recent_only and not filters.windowed:
                # The scope's share of the events is known: take about three times the
                # candidates it should let through (a wide scope needs few more than k).
                share = allowed / max(self._doc_count(), allowed)
                cand = min(cand, max(k, math.ceil(3 * k / share)))
        if ranges and recent_only and _scanned(ranges) > RECENT_SPAN:
            # Frequent terms only, over ranges holding many events: the most recent matches
            # overall (cheap, and enough for a scope that is busy now), then the most recent
            # in the ranges. Ranges also hold other sessions' events written in between, so
            # either can come short of k: then every match in the ranges is ranked.
            rows = self._fetch(
                f"WITH m AS ({head.sql} ORDER BY rowid DESC LIMIT ?{tail}",
                [*head.args, RECENT_CAP, *filters.args, k],
            )
            if len(rows) < k and sum(hi - lo + 1 for lo, hi in ranges) > RECENT_SPAN:
                # (Ranges holding few events: ranking all of them costs what this step does.)
                rows = self._in_ranges(head, ranges, RECENT_CAP, tail, [*filters.args, k])
            if len(rows) < k:
                rows = self._in_ranges(head, ranges, None, tail, [*filters.args, k])
            return self._hits(rows), needles
        if ranges:
            # Restrictive filter: every match in the allowed sessions' rowid ranges is
            # ranked (frequent terms too: the ranges hold few events), then the exact
            # filters apply.
            rows = self._in_ranges(head, ranges, None, tail, [*filters.args, k])
            return self._hits(rows), needles
        rows = self._fetch(
            f"WITH m AS ({head.sql} {inner_order} LIMIT ?{tail}",
            [*head.args, cand, *filters.args, k],
        )
        if filtered and len(rows) < k:
            # Two-phase: the top candidates were filtered away; rank every match that
            # passes the filters (costlier, only for restrictive filters).
            n_cand = self._fetch(
                "SELECT COUNT(*) FROM (SELECT 1 FROM events_fts WHERE events_fts MATCH ? LIMIT ?)",
                (match, cand + 1),
            )[0][0]
            if n_cand > cand:
                # A time window is checked per match, against the window's events (one
                # index range, read once into a lookup table), before bm25 is computed and
                # before the match is joined; with no session filter left to apply, the
                # window's best candidates are all the tail needs.
                window, wargs = _window_sql(filters.since, filters.until)
                only = "" if not window or session_level else " ORDER BY score, rowid DESC LIMIT ?"
                rows = self._fetch(
                    f"WITH m AS MATERIALIZED ({head.sql}{window}{only}{tail}",
                    [*head.args, *wargs, *([cand] if only else []), *filters.args, k],
                )
        return self._hits(rows), needles

    def _ranked_in_scope(
        self, query: str, stats: ScopeStats, k: int, filters: _Filter
    ) -> tuple[list[EpisodeHit], list[str]]:
        """``search_ranked`` in a workspace scope, with its statistics (``stats``): as a
        store holding the scope's events alone would rank, whatever else the store holds.
        So no step may depend on events outside the scope, not even which step runs: every
        match in the scope is ranked (a cut to the best candidates, as without a scope,
        would choose among equal scores by a path that the store's size picks), and a query
        of frequent terms is answered from the scope's RECENT_CAP most recent matches that
        pass the session-level filters and the time window."""
        match, recent_only, needles, phrases = self._plan_query(query, stats)
        if stats.rows == 0:
            return [], needles
        if filters.windowed and not self._has_events(filters.since, filters.until):
            return [], needles  # no event at all in the time window
        idf = [fts.bm25_idf(stats.rows, self._hits_in(stats, p)) for p in phrases]
        tail = _tail(filters.conds)
        window, wargs = _window_sql(filters.since, filters.until)
        with contextlib.ExitStack() as held:
            if recent_only:
                only = self._filter_mask(stats, filters)
                lo, hi = stats.hull if only is stats.mask else _hull(only)
                head = _Head.scoped(match, stats, idf, held.enter_context(SCOPES.hold(only)))
                rows = self._fetch(
                    f"WITH m AS ({head.sql} AND rowid BETWEEN ? AND ?{window}{head.check} "
                    f"ORDER BY rowid DESC LIMIT ?{tail}",
                    [*head.args, lo, hi, *wargs, *head.check_args, RECENT_CAP, *filters.args, k],
                )
                return self._hits(rows), needles
            head = _Head.scoped(match, stats, idf, held.enter_context(SCOPES.hold(stats.mask)))
            ranges, allowed = self._scope(stats.roots, filters.session_ids, filters.outcome)
            if allowed == 0:
                return [], needles
            if ranges and not window:
                # The sessions' rowid ranges bound the scan (which ranges the store's other
                # events make them does not change which matches they hold in the scope).
                rows = self._in_ranges(head, ranges, None, tail, [*filters.args, k])
            else:
                lo, hi = stats.hull
                rows = self._fetch(
                    f"WITH m AS ({head.sql} AND rowid BETWEEN ? AND ?{window}{head.check}{tail}",
                    [*head.args, lo, hi, *wargs, *head.check_args, *filters.args, k],
                )
        return self._hits(rows), needles

    def _filter_mask(self, stats: ScopeStats, filters: _Filter) -> np.ndarray:
        """The scope's events that the session-level filters keep (a boolean per id):
        ``stats.mask`` without filters, else counted once per index revision."""
        if not filters.session_level:
            return stats.mask
        session_ids, outcome = filters.session_ids, filters.outcome
        flt = self._filters(list(stats.roots), session_ids, None, None, outcome, e_alias=None)
        if flt is None:
            return np.zeros(0, dtype=bool)
        name = self.conn.filename
        known = _filter_memos[name].at(self.index_rev()) if name else {}
        key = (stats.roots, None if session_ids is None else tuple(session_ids), outcome)
        mask = known.get(key)
        if mask is None:
            conds, args = flt
            ids, _ = self._scope_events(" AND ".join(conds), args, 0, stats.upto, False, False)
            mask = known[key] = np.zeros(stats.upto + 1, dtype=bool)
            mask[ids] = True
        return mask

    def _has_events(self, since: datetime | None, until: datetime | None) -> bool:
        """Whether any event lies in the time window (one seek in the time index)."""
        conds, args = _time_conds(since, until)
        sql = f"SELECT 1 FROM events WHERE {' AND '.join(conds)} LIMIT 1"  # noqa: S608 - conditions made here of constants and placeholders, values bound
        return self.conn.execute(sql, args).fetchone() is not None

    def _fetch(self, sql: str, args: Sequence[Any]) -> list[Any]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except apsw.SQLError as exc:  # should not happen: every term is quoted
            raise InvalidQuery("query could not be parsed") from exc

    def _in_ranges(
        self,
        head: _Head,
        ranges: Sequence[tuple[int, int]],
        recent: int | None,
        tail: str,
        args: Sequence[Any],
    ) -> list[Any]:
        """The query ``WITH m AS (matches in ``ranges``, with their bm25)`` + ``tail``;
        with ``recent``, only that many of the most recent matches in the ranges.

        A few ranges are pushed into FTS5 as they are (it seeks its doclists by rowid);
        more are one scan over their hull, each match checked against the ranges (a
        bisect) before bm25 is computed: one bm25 setup (a walk over each term's posting
        list) in all, where one statement per range paid it per range."""
        with contextlib.ExitStack() as stack:
            if len(ranges) <= FEW_RANGES:
                parts = " UNION ALL ".join(
                    f"{head.sql} AND rowid BETWEEN ? AND ?{head.check}" for _ in ranges
                )
                rargs: list[Any] = []
                for lo, hi in ranges:
                    rargs.extend([*head.args, lo, hi, *head.check_args])
            else:
                token = stack.enter_context(
                    RANGES.hold(([lo for lo, _ in ranges], [hi for _, hi in ranges]))
                )
                parts = (
                    f"{head.sql} AND rowid BETWEEN ? AND ? "
                    f"AND knowledge_in_ranges(rowid, ?){head.check}"
                )
                rargs = [*head.args, ranges[0][0], ranges[-1][1], token, *head.check_args]
            if recent is not None:
                parts = f"SELECT rid, score FROM ({parts}) ORDER BY rid DESC LIMIT {int(recent)}"  # noqa: S608 - constant fragments and an int
            return self._fetch(f"WITH m AS ({parts}{tail}", [*rargs, *args])

    def _scope(
        self, workspaces: Sequence[str] | None, session_ids: Sequence[str] | None, outcome: str
    ) -> tuple[list[tuple[int, int]] | None, int]:
        """(rowid ranges covering the sessions the session-level filters allow, the number
        of events they allow). Ranges are None when the scope is too wide for them to pay.

        Remembered per index revision: a caller's scope (a token's workspaces) is the same
        on every search it makes, and summing it is a walk over all its sessions."""
        key = (
            None if workspaces is None else tuple(workspaces),
            None if session_ids is None else tuple(session_ids),
            outcome,
        )
        name = self.conn.filename  # in-memory databases all have the name "": not remembered
        known = _scope_memos[name].at(self.index_rev()) if name else {}
        hit = known.get(key)
        if hit is None:
            hit = known[key] = self._read_scope(workspaces, session_ids, outcome)
        return hit

    def _read_scope(
        self, workspaces: Sequence[str] | None, session_ids: Sequence[str] | None, outcome: str
    ) -> tuple[list[tuple[int, int]] | None, int]:
        flt = self._filters(workspaces, session_ids, None, None, outcome, e_alias=None)
        if flt is None:
            return [], 0
        conds, args = flt
        where = " WHERE " + " AND ".join(conds)
        total = int(
            one_row(
                self.conn,
                f"SELECT COALESCE(SUM(s.event_count), 0) FROM sessions s{where}",  # noqa: S608 - conditions made here of constants and placeholders, values bound
                args,
            )[0]
        )
        if total == 0:
            return [], 0
        if total > self._doc_count() * RESTRICTIVE_SHARE:
            return None, total
        rows = cast(
            list[tuple[int, int]],
            self.conn.execute(
                f"SELECT s.min_event_id, s.max_event_id FROM sessions s{where} AND s.event_count > 0 ORDER BY 1",  # noqa: S608 - conditions made here of constants and placeholders, values bound
                args,
            ).fetchall(),
        )
        ranges: list[list[int]] = []
        for lo, hi in rows:
            if ranges and lo <= ranges[-1][1] + 1:
                ranges[-1][1] = max(ranges[-1][1], hi)
            else:
                ranges.append([lo, hi])
        return [(lo, hi) for lo, hi in ranges], total

    @staticmethod
    def _hits(rows: list[Any]) -> list[EpisodeHit]:
        return [
            EpisodeHit(
                id=make_event_id(r[1], r[2]),
                session_id=r[1],
                seq=r[2],
                event_type=r[3],
                time=_dt(r[4]),
                snippet="",
                score=round(-float(r[7]), 6),
                rank=i,
                why=[f"fts: match in {r[3]}"],
                session=None,
                tool_name=r[5],
                is_error=bool(r[6]),
                row_id=r[0],
            )
            for i, r in enumerate(rows, start=1)
        ]

    def describe(
        self, hits: Sequence[EpisodeHit], needles: Sequence[str], snippet_chars: int
    ) -> list[EpisodeHit]:
        """``hits`` with their snippets and sessions, read in one query. A hit whose event
        is gone (its log was forgotten since) keeps an empty snippet and no session."""
        if not hits:
            return []
        rows = self.conn.execute(
            f"SELECT e.id, e.text, {_S_SESSION_COLS}"  # noqa: S608 - constant column list
            " FROM events e JOIN sessions s ON s.session_id = e.session_id"
            " WHERE e.id IN (SELECT value FROM carray(?))",
            (int_array([h.row_id for h in hits]),),
        ).fetchall()
        found = {r[0]: r for r in rows}
        now = _time.time()
        out = []
        for h in hits:
            r = found.get(h.row_id)
            if r is None:
                out.append(h)
                continue
            sess = self._session_from_row(r[2:], now)
            sess.source_path = None  # hits are session + seq + snippet, never a file path
            text = cast(str, r[1])
            out.append(replace(h, snippet=make_snippet(text, needles, snippet_chars), session=sess))
        return out

    def get_event(self, event_id: str, neighbours: int = 0) -> EventDetail | None:
        try:
            sid, seq = parse_event_id(event_id)
        except ValueError as exc:
            raise InvalidQuery(str(exc)) from exc
        row = self.conn.execute(
            "SELECT session_id, seq, event_type, time, text, is_error, tool_name, meta FROM events "
            "WHERE session_id = ? AND seq = ?",
            (sid, seq),
        ).fetchone()
        if row is None:
            return None
        detail = self._detail(row)
        srow = self.conn.execute(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE session_id = ?",  # noqa: S608 - constant column list
            (sid,),
        ).fetchone()
        if srow:
            detail.session = self._session_from_row(srow, _time.time())
        n = max(0, min(int(neighbours), 50))
        if n:
            q = (
                "SELECT session_id, seq, event_type, time, text, is_error, tool_name, meta FROM events "
                "WHERE session_id = ? AND seq {op} ? ORDER BY seq {dir} LIMIT ?"
            )
            before = self.conn.execute(q.format(op="<", dir="DESC"), (sid, seq, n)).fetchall()
            after = self.conn.execute(q.format(op=">", dir="ASC"), (sid, seq, n)).fetchall()
            detail.before = [self._detail(r) for r in reversed(before)]
            detail.after = [self._detail(r) for r in after]
        return detail

    @staticmethod
    def _detail(r: Sequence[Any]) -> EventDetail:
        return EventDetail(
            id=make_event_id(r[0], r[1]),
            session_id=r[0],
            seq=r[1],
            event_type=r[2],
            time=_dt(r[3]),
            text=r[4],
            is_error=bool(r[5]),
            tool_name=r[6],
            meta=json.loads(r[7]) if r[7] else {},
        )

    def counts(self, workspaces: Sequence[str] | None = None) -> dict[str, int]:
        """sessions, indexed_docs (events) and live sessions, restricted to ``workspaces``."""
        flt = self._filters(workspaces, None, None, None, "any", e_alias=None)
        if flt is None:
            return {"sessions": 0, "indexed_docs": 0, "live_sessions": 0}
        conds, args = flt
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        cutoff = _time.time() - self.live_minutes * 60
        row = one_row(
            self.conn,
            "SELECT COUNT(*), COALESCE(SUM(s.event_count), 0), "  # noqa: S608 - conditions made here of constants and placeholders, values bound
            "COALESCE(SUM(CASE WHEN s.persisted = 0 OR s.source_mtime >= ? THEN 1 ELSE 0 END), 0) "
            f"FROM sessions s{where}",
            [cutoff, *args],
        )
        return {"sessions": row[0], "indexed_docs": row[1], "live_sessions": row[2]}

    def sessions(self, workspaces: Sequence[str] | None = None) -> list[SessionInfo]:
        flt = self._filters(workspaces, None, None, None, "any", e_alias=None)
        if flt is None:
            return []
        conds, args = flt
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        now = _time.time()
        rows = self.conn.execute(
            f"SELECT {_S_SESSION_COLS} FROM sessions s{where} ORDER BY s.created_at, s.session_id",  # noqa: S608 - conditions made here of constants and placeholders, values bound
            args,
        ).fetchall()
        return [self._session_from_row(r, now) for r in rows]

    def iter_events_meta(self, session_ids: Sequence[str] | None = None) -> Iterator[EventMeta]:
        """Every event without its text, in (session_id, seq) order."""
        sql = "SELECT session_id, seq, event_type, tool_name, meta, is_error, time FROM events"
        args: list[Any] = []
        if session_ids is not None:
            ids = list(session_ids)
            if not ids:
                return
            sql += f" WHERE session_id IN ({','.join('?' * len(ids))})"
            args = ids
        sql += " ORDER BY session_id, seq"
        for r in self.conn.execute(sql, args):
            yield EventMeta(
                id=make_event_id(r[0], r[1]),
                session_id=r[0],
                seq=r[1],
                event_type=r[2],
                tool_name=r[3],
                meta=json.loads(r[4]) if r[4] else {},
                is_error=bool(r[5]),
                time=_dt(r[6]),
            )


_SCAN_CHARS = 2048


def _first_needle(text: str, needles: list[str]) -> int:
    """Where the first of the (lower-case) needles starts in ``text``, case-insensitively; -1
    when none occurs. The text is lowered and searched a window at a time, so a match near
    the start of a 20,000-character tool output costs one window, not the whole text."""
    if not needles:
        return -1
    overlap = max(len(nd) for nd in needles) - 1
    start = 0
    while start < len(text):
        low = text[start : start + _SCAN_CHARS + overlap].lower()
        found = [i for i in (low.find(nd) for nd in needles) if i != -1]
        if found:
            return start + min(found)
        start += _SCAN_CHARS
    return -1


def make_snippet(text: str, needles: Sequence[str], width: int) -> str:
    """A window of ``width`` characters around the first occurrence of any query needle."""
    width = max(20, int(width))
    if len(text) <= width:
        return text
    best = _first_needle(text, [nd.lower() for nd in needles if nd])
    if best == -1:
        return text[: width - 1] + "…"
    start = max(0, best - width // 3)
    end = min(len(text), start + width)
    start = max(0, end - width)
    out = text[start:end]
    if start > 0:
        out = "…" + out[1:]
    if end < len(text):
        out = out[:-1] + "…"
    return out


def _fold_session_cwds(cur: apsw.Cursor) -> None:
    """Fold the session directories written before they were stored normalised
    (``workspaces.stored_cwd``), in a new index revision if any changed (the derived store
    re-derives those sessions: their signature holds the cwd)."""
    rows = cur.execute("SELECT session_id, cwd FROM sessions WHERE cwd IS NOT NULL").fetchall()
    changed = [(new, sid) for sid, cwd in rows if (new := stored_cwd(str(cwd))) != cwd]
    cur.executemany("UPDATE sessions SET cwd = ? WHERE session_id = ?", changed)
    if changed:
        EpisodeStore._bump_rev(cur)
        EpisodeStore._bump_gen(cur)


def _plain_names(cur: apsw.Cursor) -> None:
    """The names a log gave (sessions' titles, models, agent presets and types; events'
    types, tools and agent types), stored before the importers redacted and cut them
    (``importers.plain_name``), made plain, in a new index revision if any changed: they
    become actor ids and names quoted in hand-off packages. Each distinct value is judged
    once; only the rows holding one that changes are written."""
    changed = False
    for table, column, limit in (
        ("sessions", "title", MAX_TITLE),
        ("sessions", "model", MAX_NAME),
        ("sessions", "agent_preset", MAX_NAME),
        ("sessions", "subagent_type", MAX_NAME),
        ("events", "event_type", MAX_NAME),
        ("events", "tool_name", MAX_NAME),
    ):
        values = cur.execute(
            f"SELECT DISTINCT {column} FROM {table} WHERE {column} IS NOT NULL"  # noqa: S608 - our own table and column names
        ).fetchall()
        for (value,) in values:
            new = plain_name(str(value), limit)
            if new != value:
                cur.execute(
                    f"UPDATE {table} SET {column} = ? WHERE {column} = ?",  # noqa: S608 - as above
                    (new, value),
                )
                changed = True
    rows = cur.execute(
        """SELECT id, meta FROM events WHERE instr(meta, '"subagent_type"') > 0"""
    ).fetchall()
    for event_id, raw in rows:
        try:
            meta = json.loads(str(raw))
        except ValueError:
            continue
        kind = meta.get("subagent_type") if isinstance(meta, dict) else None
        if isinstance(kind, str) and (new := plain_name(kind)) != kind:
            meta["subagent_type"] = new
            cur.execute(
                "UPDATE events SET meta = ? WHERE id = ?",
                (json.dumps(meta, ensure_ascii=False), event_id),
            )
            changed = True
    if changed:
        EpisodeStore._bump_rev(cur)
        EpisodeStore._bump_gen(cur)


def _codex_context_digests(cur: apsw.Cursor) -> None:
    """The Codex importer's context, stored with each file's state, kept the raw text of
    recent messages (not redacted) for its duplicate check: each becomes the digest the
    importer now keeps, so a file never read again gives them up too."""
    paths = [
        str(r[0])
        for r in cur.execute("SELECT path FROM sources WHERE format = 'codex' AND ctx IS NOT NULL")
    ]
    # The rows' old text is overwritten where SQLite frees it, not left in free pages.
    (was,) = one_row(cur, "PRAGMA secure_delete")
    cur.execute("PRAGMA secure_delete = ON")
    try:
        for path in paths:  # one context in memory at a time
            for (raw,) in cur.execute("SELECT ctx FROM sources WHERE path = ?", (path,)).fetchall():
                try:
                    ctx = json.loads(str(raw))
                except ValueError:
                    continue
                if not isinstance(ctx, dict) or not isinstance(ctx.get("recent"), list):
                    continue
                ctx["recent"] = recent_digests(ctx["recent"])
                cur.execute(
                    "UPDATE sources SET ctx = ? WHERE path = ?",
                    (json.dumps(ctx, ensure_ascii=False), path),
                )
    finally:
        cur.execute(f"PRAGMA secure_delete = {'FAST' if int(was) == 2 else int(was)}")


def _legacy(cur: apsw.Cursor) -> list[str]:
    """The steps a store written before they were recorded has: the baseline, and the
    cwd folding where its ``lane_meta`` flag says it ran."""
    if not has_schema(cur, _BASELINE):
        return []
    folded = cur.execute("SELECT 1 FROM lane_meta WHERE key = 'cwd_normalised'").fetchone()
    return ["001_initial", "002_fold_session_cwds"] if folded else ["001_initial"]


# The schema as named steps (``knowledge_server.schema.Migrations``): add new ones at the end.
MIGRATIONS = Migrations(
    "episodes.sqlite",
    (
        Step("001_initial", _BASELINE),
        Step("002_fold_session_cwds", _fold_session_cwds),
        Step("003_stats_generation", EpisodeStore._bump_gen),
        Step("004_codex_context_digests", _codex_context_digests),
        Step("005_plain_names", _plain_names),
    ),
    legacy=_legacy,
)
