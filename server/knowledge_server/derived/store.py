"""``derived.sqlite``: actors, skills, skill uses and assignments (the L3 layer).

Only ids, refs, counters, names and outcomes are stored: never session or code text.
One writer (the rebuild, plus small assignment transactions); readers use WAL snapshots.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self, cast

import apsw

from knowledge_server import fts
from knowledge_server.schema import Migrations, Step, has_schema, open_db
from knowledge_server.workspaces import in_scope, under_sql

from ..episodes.model import parse_event_id

DB_FILE = "derived.sqlite"
ASSIGNMENT_STATUS = "recorded_plan"
ACTOR_KINDS = ("root_session", "subagent", "team_member", "autoclaw_agent")

_BASELINE = """
CREATE TABLE actor (
    actor_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    source TEXT NOT NULL,
    harness TEXT NOT NULL,
    root_session_id TEXT,
    session_count INTEGER NOT NULL DEFAULT 0,
    event_count INTEGER NOT NULL DEFAULT 0,
    success INTEGER NOT NULL DEFAULT 0,
    failure INTEGER NOT NULL DEFAULT 0,
    unknown INTEGER NOT NULL DEFAULT 0,
    first_seen TEXT,
    last_seen TEXT,
    workspace_cwd TEXT
);
CREATE INDEX actor_kind ON actor(kind);
-- One row per (actor, session) with that session's contribution; actor rows are
-- aggregated from it so an incremental rebuild only rewrites the changed sessions.
CREATE TABLE actor_session (
    actor_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    event_count INTEGER NOT NULL DEFAULT 0,
    outcome TEXT NOT NULL DEFAULT 'unknown',
    first_seen TEXT,
    last_seen TEXT,
    PRIMARY KEY (actor_id, session_id)
);
CREATE INDEX actor_session_sid ON actor_session(session_id);
-- The actor a whole session belongs to (+ its cwd for workspace filters).
CREATE TABLE session_actor (
    session_id TEXT PRIMARY KEY,
    actor_id TEXT NOT NULL,
    harness TEXT NOT NULL,
    cwd TEXT
);
CREATE INDEX session_actor_actor ON session_actor(actor_id);
CREATE INDEX session_actor_cwd ON session_actor(cwd);
-- Runs of 1.x inline sidechain events inside a root session (seq bounds inclusive).
CREATE TABLE sidechain_span (
    session_id TEXT NOT NULL,
    seq_from INTEGER NOT NULL,
    seq_to INTEGER NOT NULL,
    actor_id TEXT NOT NULL,
    PRIMARY KEY (session_id, seq_from)
);
CREATE TABLE failed_event (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    actor_id TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX failed_event_actor ON failed_event(actor_id);
CREATE TABLE skill (
    name TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    description TEXT NOT NULL,
    when_to_use TEXT,
    content_hash TEXT NOT NULL
);
CREATE VIRTUAL TABLE skill_fts USING fts5(
    name, description, when_to_use, tokenize = "unicode61 remove_diacritics 2"
);
CREATE TABLE skill_use (
    actor_id TEXT NOT NULL,
    skill TEXT NOT NULL,
    episode_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    time TEXT,
    outcome TEXT NOT NULL DEFAULT 'unknown',
    via TEXT NOT NULL,
    PRIMARY KEY (episode_id, skill)
);
CREATE INDEX skill_use_skill ON skill_use(skill, actor_id);
CREATE INDEX skill_use_actor ON skill_use(actor_id);
CREATE INDEX skill_use_session ON skill_use(session_id);
CREATE TABLE assignment (
    assignment_id TEXT PRIMARY KEY,
    actor_id TEXT NOT NULL,
    task_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    outbox_path TEXT,
    UNIQUE (actor_id, task_hash)
);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
-- Incremental state: per session a signature of what the derivation depended on.
CREATE TABLE build_state (
    session_id TEXT PRIMARY KEY,
    signature TEXT NOT NULL,
    last_seq INTEGER
);
"""


def _legacy(cur: apsw.Cursor) -> list[str]:
    """A store written before its steps were recorded had the baseline, nothing more."""
    return ["001_initial"] if has_schema(cur, _BASELINE) else []


# A skill is keyed by its file (its real path), not its name: two workspaces' catalogs
# may each hold a skill called "deploy". Keyed by name, one tenant's skill hid the other's.
# The catalog is written again by the next rebuild (its fingerprint is forgotten).
_SKILL_BY_PATH = """
DROP TABLE skill;
CREATE TABLE skill (
    name TEXT NOT NULL,
    path TEXT PRIMARY KEY,
    description TEXT NOT NULL,
    when_to_use TEXT,
    content_hash TEXT NOT NULL
);
CREATE INDEX skill_name ON skill(name);
DELETE FROM skill_fts;
DELETE FROM meta WHERE key = 'catalog_fp';
"""

# An assignment's task without its actor (the task and the committer's view, as a digest):
# a repeated commit that lets the service choose the actor finds the task's assignment by it.
_ASSIGNMENT_TASK_KEY = """
ALTER TABLE assignment ADD COLUMN task_key TEXT;
CREATE INDEX assignment_task_key ON assignment(task_key);
"""

# The schema as named steps (``knowledge_server.schema.Migrations``): add new ones at the end.
MIGRATIONS = Migrations(
    "derived.sqlite",
    (
        Step("001_initial", _BASELINE),
        Step("002_skill_by_path", _SKILL_BY_PATH),
        Step("003_assignment_task_key", _ASSIGNMENT_TASK_KEY),
    ),
    legacy=_legacy,
)


@dataclass(slots=True, frozen=True)
class ActorInfo:
    actor_id: str
    kind: str
    name: str
    source: str
    harness: str
    root_session_id: str | None
    session_count: int
    event_count: int
    success: int
    failure: int
    unknown: int
    first_seen: str | None
    last_seen: str | None
    workspace_cwd: str | None


@dataclass(slots=True, frozen=True)
class SkillUse:
    actor_id: str
    skill: str
    episode_id: str
    session_id: str
    seq: int
    time: str | None
    outcome: str
    via: str  # skill_tool | slash_command | read_skill_file | meta


@dataclass(slots=True, frozen=True)
class Assignment:
    assignment_id: str
    actor_id: str
    task_hash: str
    status: str
    created_at: str
    outbox_path: str | None


_ACTOR_COLS = (
    "actor_id, kind, name, source, harness, root_session_id, session_count, event_count, "
    "success, failure, unknown, first_seen, last_seen, workspace_cwd"
)
_USE_COLS = "actor_id, skill, episode_id, session_id, seq, time, outcome, via"


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def workspace_clause(column: str, workspaces: Sequence[str] | None) -> tuple[str, list[Any]] | None:
    """SQL restricting ``column`` (a cwd) to workspace roots; ``None`` = nothing matches.

    Same rule as the episodes lane: equal to a root or under it (``under_sql``).
    """
    if workspaces is None:
        return "1", []
    roots = [os.path.normpath(w) for w in workspaces if w]
    if not roots:
        return None
    return under_sql(column, roots)


def actor_in_scope(
    info: ActorInfo, folders: frozenset[str | None], scope: Sequence[str] | None
) -> bool:
    """Whether a caller seeing ``scope`` (None: everything) sees every session an actor was
    made of: its workspace (the folder holding them all) is in scope, or each of its
    sessions' ``folders`` is (a caller of two workspaces, not of their parent)."""
    if in_scope(info.workspace_cwd, scope):
        return True
    return bool(folders) and all(f is not None and in_scope(f, scope) for f in folders)


def visible_actor_sql(alias: str, workspaces: Sequence[str] | None) -> tuple[str, list[Any]] | None:
    """SQL true for the actors (table alias ``alias``) a caller of ``workspaces`` sees, as
    ``actor_in_scope`` decides: the actor's workspace is in scope, or every session it was
    made of lies in scope (a caller of ws_a and ws_b sees an actor of both, whose common
    folder is their parent). None: none is seen."""
    common = workspace_clause(f"{alias}.workspace_cwd", workspaces)
    each = workspace_clause("vsa.cwd", workspaces)
    if common is None or each is None:
        return None
    if common[0] == "1":
        return "1", []
    return (
        f"({common[0]} OR (EXISTS (SELECT 1 FROM actor_session vs WHERE vs.actor_id ="  # noqa: S608 - an alias of ours and placeholders, values bound
        f" {alias}.actor_id) AND NOT EXISTS (SELECT 1 FROM actor_session vs LEFT JOIN"
        " session_actor vsa ON vsa.session_id = vs.session_id WHERE vs.actor_id ="
        f" {alias}.actor_id AND (vsa.cwd IS NULL OR NOT {each[0]}))))",
        [*common[1], *each[1]],
    )


def assignment_id_for(actor_id: str, task_hash: str) -> str:
    return "assign:" + hashlib.sha256(f"{actor_id}\0{task_hash}".encode()).hexdigest()[:24]


class DerivedStore:
    """Open (and create) ``derived.sqlite``; ``read_only=True`` never writes."""

    BUSY_MS = 30_000  # how long the connection waits for another one's lock

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        if os.path.isdir(path):
            path = os.path.join(path, DB_FILE)
        self.path = path
        self.read_only = read_only
        # apsw serialises calls on one connection, but a transaction spans several calls:
        # this lock keeps two threads sharing the object from interleaving theirs.
        self._lock = threading.RLock()
        self.conn = open_db(path, MIGRATIONS, read_only=read_only, busy_ms=self.BUSY_MS)
        # A scoped skills search scores with its scope's statistics (derived.lane._score).
        fts.register_scoped_bm25(self.conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ meta

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def index_rev(self) -> str:
        return self.get_meta("index_rev") or ""

    def is_built(self) -> bool:
        return bool(self.get_meta("index_rev"))

    def counts(self, workspaces: Sequence[str] | None = None) -> dict[str, int]:
        """Row counts, within ``workspaces`` when given (``[]`` = none): the skills whose
        ``SKILL.md`` lies under a root, the actors whose workspace does, the uses from
        sessions there and the assignments of those actors. The joins are on primary keys,
        so unscoped counts are the tables' row counts."""

        def count(sql: str, column: str, *extra: Any) -> int:
            clause = workspace_clause(column, workspaces) or ("0", [])
            (n,) = self.conn.execute(f"{sql} AND {clause[0]}", [*extra, *clause[1]]).fetchall()[0]
            return int(cast(int, n))

        def actors(kind: str | None = None) -> int:
            visible = visible_actor_sql("a", workspaces)
            if visible is None:
                return 0
            (n,) = self.conn.execute(
                "SELECT COUNT(*) FROM actor a WHERE (? IS NULL OR a.kind = ?) AND "  # noqa: S608 - conditions made here of constants and placeholders, values bound
                + visible[0],
                [kind, kind, *visible[1]],
            ).fetchall()[0]
            return int(cast(int, n))

        out = {
            "actors": actors(),
            "skills": count("SELECT COUNT(*) FROM skill WHERE 1", "path"),
            "skill_uses": count(
                "SELECT COUNT(*) FROM skill_use u "
                "LEFT JOIN session_actor sa ON sa.session_id = u.session_id WHERE 1",
                "sa.cwd",
            ),
            "assignments": count(
                "SELECT COUNT(*) FROM assignment g "
                "LEFT JOIN actor a ON a.actor_id = g.actor_id WHERE 1",
                "a.workspace_cwd",
            ),
        }
        for kind in ACTOR_KINDS:
            out[f"actors_{kind}"] = actors(kind)
        return out

    # ------------------------------------------------------------------ actors

    @staticmethod
    def _actor(row: Sequence[Any]) -> ActorInfo:
        return ActorInfo(*row)

    def actor_folders(self, actor_id: str) -> frozenset[str | None]:
        """The folders (cwds) of every session the actor was made of; None for a session
        without one."""
        rows = self.conn.execute(
            "SELECT DISTINCT sa.cwd FROM actor_session a"
            " LEFT JOIN session_actor sa ON sa.session_id = a.session_id WHERE a.actor_id = ?",
            (actor_id,),
        )
        return frozenset((str(cwd) if cwd else None) for (cwd,) in rows)

    def actor_visible(self, info: ActorInfo, scope: Sequence[str] | None) -> bool:
        """``actor_in_scope`` for ``info``, its sessions' folders read when needed."""
        return in_scope(info.workspace_cwd, scope) or actor_in_scope(
            info, self.actor_folders(info.actor_id), scope
        )

    def actor(self, actor_id: str) -> ActorInfo | None:
        row = self.conn.execute(
            f"SELECT {_ACTOR_COLS} FROM actor WHERE actor_id = ?",  # noqa: S608 - constant column list
            (actor_id,),
        ).fetchone()
        return self._actor(row) if row else None

    def actors(
        self, kind: str | None = None, workspaces: Sequence[str] | None = None
    ) -> list[ActorInfo]:
        ws = workspace_clause("workspace_cwd", workspaces)
        if ws is None:
            return []
        sql = f"SELECT {_ACTOR_COLS} FROM actor WHERE {ws[0]}"  # noqa: S608 - constant columns, under_sql placeholders
        args = list(ws[1])
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        return [self._actor(r) for r in self.conn.execute(sql + " ORDER BY actor_id", args)]

    def actors_for_sessions(self, session_ids: Sequence[str]) -> list[ActorInfo]:
        """Every actor that took part in one of ``session_ids`` (sidechains included)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return []
        rows = self.conn.execute(
            f"SELECT {', '.join('a.' + c.strip() for c in _ACTOR_COLS.split(','))} FROM actor a "  # noqa: S608 - constant columns and placeholders
            "WHERE a.actor_id IN (SELECT actor_id FROM actor_session WHERE session_id IN "
            f"({','.join('?' * len(ids))})) ORDER BY a.actor_id",
            ids,
        ).fetchall()
        return [self._actor(r) for r in rows]

    def session_actors(self, session_ids: Sequence[str]) -> dict[str, str]:
        """session id -> the actor of the whole session (inline sidechains aside)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return {}
        rows = self.conn.execute(
            f"SELECT session_id, actor_id FROM session_actor WHERE session_id IN ({','.join('?' * len(ids))})",  # noqa: S608 - only placeholders are interpolated, values bound
            ids,
        )
        return {r[0]: r[1] for r in rows}

    def episode_actor(
        self, session_id: str, meta: dict[str, Any] | None = None, seq: int | None = None
    ) -> str | None:
        """The actor of one episode event.

        Rule: the session's actor from ``session_actor``; if that actor is a root session
        and the event is an inline sidechain event (``meta.is_sidechain``, or ``seq`` inside
        a recorded sidechain span), the inline subagent actor instead. ``None`` when the
        session is unknown to the derived layer (not built yet).
        """
        row = self.conn.execute(
            "SELECT s.actor_id, s.harness, a.kind FROM session_actor s LEFT JOIN actor a "
            "ON a.actor_id = s.actor_id WHERE s.session_id = ?",
            (session_id,),
        ).fetchone()
        if row is None:
            return None
        actor_id, harness, kind = cast(tuple[str, str, str | None], row)
        if kind != "root_session":
            return actor_id
        if meta is not None:
            if meta.get("is_sidechain"):
                return sidechain_actor_id(harness, session_id, meta.get("agent_id"))
            return actor_id
        if seq is not None:
            # Spans of one session never overlap, so at most one row matches.
            span = self.conn.execute(
                "SELECT actor_id FROM sidechain_span WHERE session_id = ? AND seq_from <= ? "
                "AND seq_to >= ?",
                (session_id, seq, seq),
            ).fetchone()
            if span is not None:
                return str(span[0])
        return actor_id

    def episode_actors(self, episode_ids: Sequence[str]) -> dict[str, str]:
        """``ep:<session>:<seq>`` -> actor id for every id the derived layer knows."""
        out: dict[str, str] = {}
        for eid in dict.fromkeys(episode_ids):
            try:
                sid, seq = parse_event_id(eid)
            except ValueError:
                continue
            aid = self.episode_actor(sid, seq=seq)
            if aid is not None:
                out[eid] = aid
        return out

    def actor_outcomes(self, actor_id: str) -> dict[str, int]:
        row = self.conn.execute(
            "SELECT success, failure, unknown FROM actor WHERE actor_id = ?", (actor_id,)
        ).fetchone()
        if row is None:
            return {"success": 0, "failure": 0, "unknown": 0}
        return {"success": row[0], "failure": row[1], "unknown": row[2]}

    def failures(
        self,
        actor_id: str | None = None,
        session_ids: Sequence[str] | None = None,
        limit: int = 50,
    ) -> list[str]:
        """Episode ids of failed events (tool errors, error signals): the newest ``limit``,
        by when their session was last active, oldest first (the newest last).

        Restricted to ``actor_id`` and/or ``session_ids``; both ``None`` means every actor.
        Ordered by session id, as before, the "recent failures" of a hand-off package were
        the alphabetically last sessions' among the first ``limit``.
        """
        conds, args = [], []
        if actor_id is not None:
            conds.append("f.actor_id = ?")
            args.append(actor_id)
        if session_ids is not None:
            ids = list(dict.fromkeys(session_ids))
            if not ids:
                return []
            conds.append(f"f.session_id IN ({','.join('?' * len(ids))})")
            args.extend(ids)
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        rows = self.conn.execute(
            "SELECT f.session_id, f.seq, (SELECT max(a.last_seen) FROM actor_session a"  # noqa: S608 - conditions made here of constants and placeholders, values bound
            f" WHERE a.session_id = f.session_id) AS t FROM failed_event f{where}"
            " ORDER BY t DESC, f.session_id DESC, f.seq DESC LIMIT ?",
            [*args, max(0, int(limit))],
        ).fetchall()
        return [f"ep:{r[0]}:{r[1]}" for r in reversed(rows)]

    # ------------------------------------------------------------------ skills

    def skills(self) -> list[tuple[str, str, str, str | None, str]]:
        rows = self.conn.execute(
            "SELECT name, path, description, when_to_use, content_hash FROM skill ORDER BY name, path"
        ).fetchall()
        return cast(list[tuple[str, str, str, str | None, str]], rows)

    def skill_uses_by_actor(self, actor_id: str) -> list[SkillUse]:
        rows = self.conn.execute(
            f"SELECT {_USE_COLS} FROM skill_use WHERE actor_id = ? ORDER BY session_id, seq, skill",  # noqa: S608 - constant column list
            (actor_id,),
        )
        return [SkillUse(*r) for r in rows]

    def skill_uses(self, skill: str | None = None) -> list[SkillUse]:
        sql = f"SELECT {_USE_COLS} FROM skill_use"  # noqa: S608 - constant column list
        args: list[Any] = []
        if skill is not None:
            sql += " WHERE skill = ?"
            args.append(skill)
        return [
            SkillUse(*r) for r in self.conn.execute(sql + " ORDER BY skill, session_id, seq", args)
        ]

    def top_actors_for_skill(
        self, skill: str, limit: int = 5, workspaces: Sequence[str] | None = None
    ) -> list[tuple[str, int]]:
        """(actor_id, uses within ``workspaces``), most uses first, ties by actor_id: the
        actors a caller of ``workspaces`` sees (``visible_actor_sql``) only, so the first
        ``limit`` are never filled by actors it would then have to pass over."""
        ws = workspace_clause("s.cwd", workspaces)
        visible = visible_actor_sql("a", workspaces)
        if ws is None or visible is None:
            return []
        rows = self.conn.execute(
            "SELECT u.actor_id, COUNT(*) AS n FROM skill_use u "  # noqa: S608 - under_sql placeholders, values bound
            "LEFT JOIN session_actor s ON s.session_id = u.session_id "
            "JOIN actor a ON a.actor_id = u.actor_id "
            f"WHERE u.skill = ? AND {ws[0]} AND {visible[0]} "
            "GROUP BY u.actor_id ORDER BY n DESC, u.actor_id LIMIT ?",
            [skill, *ws[1], *visible[1], max(0, int(limit))],
        )
        return [(r[0], r[1]) for r in rows]

    def skills_of_actor(self, actor_id: str) -> list[tuple[str, int]]:
        rows = self.conn.execute(
            "SELECT skill, COUNT(*) AS n FROM skill_use WHERE actor_id = ? GROUP BY skill ORDER BY n DESC, skill",
            (actor_id,),
        )
        return [(r[0], r[1]) for r in rows]

    # ------------------------------------------------------------------ assignments

    def record_assignment(
        self,
        actor_id: str,
        task_hash: str,
        outbox_path: str | None = None,
        task_key: str | None = None,
    ) -> tuple[Assignment, bool]:
        """Record a ``recorded_plan`` assignment once per (actor, task).

        Idempotent under concurrent duplicates: the UNIQUE (actor_id, task_hash) constraint
        with INSERT OR IGNORE inside one IMMEDIATE transaction lets exactly one caller create
        the row; every caller gets that same row back and ``created`` tells which one won.
        """
        if self.read_only:
            raise PermissionError("the derived store is open read-only")
        aid = assignment_id_for(actor_id, task_hash)
        with self._lock:
            cur = self.conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(
                    "INSERT OR IGNORE INTO assignment (assignment_id, actor_id, task_hash, status, "
                    "created_at, outbox_path, task_key) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        aid,
                        actor_id,
                        task_hash,
                        ASSIGNMENT_STATUS,
                        _now_iso(),
                        outbox_path,
                        task_key,
                    ),
                )
                created = self.conn.changes() > 0
                row = cur.execute(
                    "SELECT assignment_id, actor_id, task_hash, status, created_at, outbox_path "
                    "FROM assignment WHERE actor_id = ? AND task_hash = ?",
                    (actor_id, task_hash),
                ).fetchone()
                if row is None:  # inserted or kept by the statement above, in this transaction
                    raise RuntimeError("the assignment row is missing inside its own transaction")
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        return Assignment(*row), created

    def assignment(self, assignment_id: str) -> Assignment | None:
        row = self.conn.execute(
            "SELECT assignment_id, actor_id, task_hash, status, created_at, outbox_path "
            "FROM assignment WHERE assignment_id = ?",
            (assignment_id,),
        ).fetchone()
        return Assignment(*row) if row else None

    def assignment_of_task(self, task_key: str) -> Assignment | None:
        """The first assignment recorded for a task (``task_key``), whichever its actor."""
        row = self.conn.execute(
            "SELECT assignment_id, actor_id, task_hash, status, created_at, outbox_path "
            "FROM assignment WHERE task_key = ? ORDER BY created_at, assignment_id LIMIT 1",
            (task_key,),
        ).fetchone()
        return Assignment(*row) if row else None

    def assignments(self, actor_id: str | None = None) -> list[Assignment]:
        sql = "SELECT assignment_id, actor_id, task_hash, status, created_at, outbox_path FROM assignment"
        args: list[Any] = []
        if actor_id is not None:
            sql += " WHERE actor_id = ?"
            args.append(actor_id)
        return [
            Assignment(*r)
            for r in self.conn.execute(sql + " ORDER BY created_at, assignment_id", args)
        ]


def sidechain_actor_id(harness: str, session_id: str, agent_id: str | None) -> str:
    return f"actor:{harness}:subagent:{session_id}:{agent_id or 'sidechain'}"


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


__all__ = [
    "ACTOR_KINDS",
    "DB_FILE",
    "MIGRATIONS",
    "ActorInfo",
    "Assignment",
    "DerivedStore",
    "SkillUse",
    "assignment_id_for",
    "sidechain_actor_id",
    "workspace_clause",
]
