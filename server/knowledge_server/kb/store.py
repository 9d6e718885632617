"""``kb.sqlite``: the knowledge base's metadata (topics, revisions, sources, tags, answer
templates, feedback, releases, the PROCESS queue), and the uploaded files' bytes.

Every row carries its organisation and every statement here filters by it: the
organisation is always the authenticated principal's (``Principal.organisation``), never a
request's. Uploaded bytes live in ``<data dir>/kb/blobs/<sha256>`` (content-addressed,
written once); the rows only name them.

One connection per serving process, used under a thread lock; writes take SQLite's
write lock first (``BEGIN IMMEDIATE``), so the serving processes of one data directory
(``workers > 1``) serialise their writes and a stale expected version is seen by whoever
comes second. Optimistic locking is in the SQL itself: an update names the version it
expects (``... WHERE org = ? AND id = ? AND version = ?``) and changes nothing otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import apsw

from knowledge_server.errors import NotFound
from knowledge_server.schema import Migrations, Step, immediate, open_db

__all__ = [
    "DB_FILE",
    "MIGRATIONS",
    "CitableRevision",
    "FeedbackRow",
    "KBStore",
    "ReleaseRow",
    "RevisionRow",
    "SourceRow",
    "StoreBusy",
    "TagRow",
    "TaskRow",
    "TemplateRow",
    "TopicRow",
    "must",
    "new_id",
    "now",
]

DB_FILE = "kb.sqlite"


class StoreBusy(Exception):
    """A read inside ``KBStore.reads_until`` could not start before its deadline: another
    thread's transaction held the store, or SQLite stayed locked."""


_BASELINE = """
CREATE TABLE policy (
    org TEXT PRIMARY KEY,
    allow_self_approval INTEGER NOT NULL DEFAULT 0,
    version INTEGER NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE topics (
    id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    knowledge_key TEXT NOT NULL,
    title TEXT NOT NULL,
    version INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (org, knowledge_key)
);
CREATE TABLE revisions (
    id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    topic_id TEXT NOT NULL,
    version_label TEXT NOT NULL,
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    created_by TEXT NOT NULL,
    submitted_by TEXT NOT NULL DEFAULT '',
    reviewed_by TEXT NOT NULL DEFAULT '',
    return_reason TEXT NOT NULL DEFAULT '',
    based_on TEXT NOT NULL DEFAULT '',
    feedback_id TEXT NOT NULL DEFAULT '',
    chunk_count INTEGER NOT NULL DEFAULT 0,
    embed_model TEXT NOT NULL DEFAULT '',
    failure TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX revisions_topic ON revisions(org, topic_id);
CREATE INDEX revisions_state ON revisions(org, state);
CREATE TABLE sources (
    id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    revision_id TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    kind TEXT NOT NULL,
    file_name TEXT NOT NULL DEFAULT '',
    media_type TEXT NOT NULL DEFAULT '',
    sha256 TEXT NOT NULL DEFAULT '',
    size INTEGER NOT NULL DEFAULT 0,
    question TEXT NOT NULL DEFAULT '',
    answer TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL
);
CREATE INDEX sources_revision ON sources(org, revision_id, ordinal);
CREATE TABLE uploads (
    id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    revision_id TEXT NOT NULL,
    file_name TEXT NOT NULL,
    media_type TEXT NOT NULL,
    received INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE tags (
    org TEXT NOT NULL,
    code TEXT NOT NULL,
    display_name TEXT NOT NULL,
    sort_order INTEGER NOT NULL,
    active INTEGER NOT NULL,
    version INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (org, code)
);
CREATE TABLE templates (
    org TEXT NOT NULL,
    code TEXT NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL,
    version INTEGER NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (org, code)
);
CREATE TABLE feedback (
    id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    topic_id TEXT NOT NULL,
    revision_id TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL,
    status TEXT NOT NULL,
    draft_revision_id TEXT NOT NULL DEFAULT '',
    version INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX feedback_org ON feedback(org, status, created_at);
-- The visible release of each topic: revision_id '' = offline (nothing visible).
CREATE TABLE releases (
    org TEXT NOT NULL,
    topic_id TEXT NOT NULL,
    revision_id TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (org, topic_id)
);
CREATE TABLE release_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    org TEXT NOT NULL,
    topic_id TEXT NOT NULL,
    revision_id TEXT NOT NULL,
    previous_id TEXT NOT NULL,
    action TEXT NOT NULL,
    principal TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX release_history_topic ON release_history(org, topic_id, seq);
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    revision_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    state TEXT NOT NULL,
    step TEXT NOT NULL DEFAULT '',
    done INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL DEFAULT 0,
    chunks INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    error_category TEXT NOT NULL DEFAULT '',
    error_message TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT '',
    lease_until REAL NOT NULL DEFAULT 0,
    version INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (org, idempotency_key)
);
CREATE INDEX tasks_state ON tasks(state, created_at);
CREATE INDEX tasks_revision ON tasks(org, revision_id);
-- One row per embedding call of a task: model identity, latency, failure category.
-- Never the text.
CREATE TABLE embed_calls (
    id INTEGER PRIMARY KEY,
    org TEXT NOT NULL,
    task_id TEXT NOT NULL,
    model TEXT NOT NULL,
    texts INTEGER NOT NULL,
    ms REAL NOT NULL,
    failure TEXT NOT NULL DEFAULT '',
    at TEXT NOT NULL
);
CREATE INDEX embed_calls_task ON embed_calls(org, task_id);
"""


def _restage_for_redaction(cur: apsw.Cursor, states: tuple[str, ...], key: str) -> None:
    """Revisions indexed before processing redacted secrets hold their sources' text as
    uploaded: each in ``states`` with chunks is queued once for a RESTAGE (the worker
    processes it again, redaction included, and replaces its chunks; its state and
    release stay as they are), under the idempotency key ``restage:<id>:<key>``. One with
    a task queued or running, or restaged for redaction already (step 003 ran, then the
    revision was retired), is left as it is."""
    stamp = now()
    marks = ",".join("?" * len(states))
    rows = cur.execute(
        "SELECT org, id FROM revisions r"  # noqa: S608 - placeholders only, values bound
        f" WHERE state IN ({marks}) AND chunk_count > 0"
        " AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.org = r.org AND t.revision_id = r.id"
        " AND (t.state IN ('QUEUED', 'RUNNING') OR (t.kind = 'RESTAGE' AND t.state ="
        " 'SUCCEEDED' AND t.idempotency_key LIKE 'restage:%:redaction%'))) ORDER BY org, id",
        states,
    ).fetchall()
    for org, revision_id in rows:
        cur.execute(
            "INSERT INTO tasks(id, org, revision_id, kind, idempotency_key, state, version,"
            " created_by, created_at, updated_at)"
            " VALUES (?, ?, ?, 'RESTAGE', ?, 'QUEUED', 1, 'server', ?, ?)"
            # A caller may have named a task with this key (ProcessRevision takes any): the
            # step must not fail the store's opening on it.
            " ON CONFLICT(org, idempotency_key) DO NOTHING",
            (new_id("task"), org, revision_id, f"restage:{revision_id}:{key}", stamp, stamp),
        )


MIGRATIONS = Migrations(
    DB_FILE,
    (
        Step("001_initial", _BASELINE),
        Step(
            "002_task_secrets_redacted",
            "ALTER TABLE tasks ADD COLUMN secrets_redacted INTEGER NOT NULL DEFAULT 0;",
        ),
        # The states whose chunks the index holds, as they were when these steps were
        # written: then those whose chunks stay until a reconcile drops them.
        Step(
            "003_restage_for_redaction",
            lambda cur: _restage_for_redaction(
                cur, ("PROCESSED", "PUBLISHED", "SUPERSEDED"), "redaction"
            ),
        ),
        Step(
            "004_restage_retired_for_redaction",
            lambda cur: _restage_for_redaction(
                cur, ("OFFLINE", "ROLLED_BACK"), "redaction-retired"
            ),
        ),
    ),
)


T = TypeVar("T")


def must(row: T | None, what: str) -> T:
    """``row``, or NOT_FOUND when it has gone (deleted between a write and its read)."""
    if row is None:
        raise NotFound(f"{what} not found")
    return row


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


@dataclass(frozen=True)
class TopicRow:
    id: str
    org: str
    knowledge_key: str
    title: str
    version: int
    created_by: str
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class RevisionRow:
    id: str
    org: str
    topic_id: str
    version_label: str
    state: str
    version: int
    tags: tuple[str, ...]
    created_by: str
    submitted_by: str
    reviewed_by: str
    return_reason: str
    based_on: str
    feedback_id: str
    chunk_count: int
    embed_model: str
    failure: str
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class SourceRow:
    id: str
    org: str
    revision_id: str
    ordinal: int
    kind: str  # "file" | "faq"
    file_name: str
    media_type: str
    sha256: str
    size: int
    question: str
    answer: str
    created_at: str


@dataclass(frozen=True)
class TagRow:
    org: str
    code: str
    display_name: str
    sort_order: int
    active: bool
    version: int
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class TemplateRow:
    org: str
    code: str
    body: str
    status: str
    version: int
    updated_by: str
    updated_at: str


@dataclass(frozen=True)
class FeedbackRow:
    id: str
    org: str
    topic_id: str
    revision_id: str
    body: str
    status: str
    draft_revision_id: str
    version: int
    created_by: str
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class CitableRevision:
    """A topic's released revision as a citation needs it."""

    revision_id: str
    topic_id: str
    version_label: str
    chunk_count: int
    topic_title: str
    source_ids: frozenset[str]


@dataclass(frozen=True)
class ReleaseRow:
    org: str
    topic_id: str
    revision_id: str
    updated_at: str


@dataclass(frozen=True)
class TaskRow:
    id: str
    org: str
    revision_id: str
    kind: str
    idempotency_key: str
    state: str
    step: str
    done: int
    total: int
    chunks: int
    attempts: int
    error_category: str
    error_message: str
    owner: str
    lease_until: float
    version: int
    created_by: str
    created_at: str
    updated_at: str
    secrets_redacted: int = 0


_TOPIC = "id, org, knowledge_key, title, version, created_by, created_at, updated_at"
_REVISION = (
    "id, org, topic_id, version_label, state, version, tags, created_by, submitted_by,"
    " reviewed_by, return_reason, based_on, feedback_id, chunk_count, embed_model, failure,"
    " created_at, updated_at"
)
_SOURCE = (
    "id, org, revision_id, ordinal, kind, file_name, media_type, sha256, size, question,"
    " answer, created_at"
)
_TAG = "org, code, display_name, sort_order, active, version, created_at, updated_at"
_TEMPLATE = "org, code, body, status, version, updated_by, updated_at"
_FEEDBACK = (
    "id, org, topic_id, revision_id, body, status, draft_revision_id, version, created_by,"
    " created_at, updated_at"
)
_TASK = (
    "id, org, revision_id, kind, idempotency_key, state, step, done, total, chunks, attempts,"
    " error_category, error_message, owner, lease_until, version, created_by, created_at,"
    " updated_at, secrets_redacted"
)


def _topic(r: Sequence[Any]) -> TopicRow:
    return TopicRow(*r)


def _revision(r: Sequence[Any]) -> RevisionRow:
    values = list(r)
    values[6] = tuple(json.loads(values[6]))
    return RevisionRow(*values)


def _source(r: Sequence[Any]) -> SourceRow:
    return SourceRow(*r)


def _tag(r: Sequence[Any]) -> TagRow:
    values = list(r)
    values[4] = bool(values[4])
    return TagRow(*values)


def _template(r: Sequence[Any]) -> TemplateRow:
    return TemplateRow(*r)


def _feedback(r: Sequence[Any]) -> FeedbackRow:
    return FeedbackRow(*r)


def _task(r: Sequence[Any]) -> TaskRow:
    return TaskRow(*r)


class KBStore:
    """The knowledge base's metadata store and blob folder in ``data_dir``.

    Reads and writes are synchronous: callers on the event loop run them in a thread
    (``deadline.off_loop``). ``tx()`` is one write transaction; the read helpers may be
    called inside it or on their own."""

    def __init__(self, data_dir: Path | str, *, busy_ms: int = 10_000) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_FILE
        self.blob_dir = self.data_dir / "kb" / "blobs"
        self.upload_dir = self.data_dir / "kb" / "uploads"
        self._busy_ms = busy_ms
        self._conn = open_db(str(self.path), MIGRATIONS, busy_ms=busy_ms)
        self._lock = threading.RLock()
        self._depth = 0
        # Per thread: the monotonic instant reads must start by (``reads_until``).
        self._read_deadline = threading.local()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- transactions -----------------------------------------------------------------
    @contextmanager
    def tx(self) -> Iterator[apsw.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``), committed on success, rolled back
        on any error: nothing is half-written. Nested calls join the outer one."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._conn
                finally:
                    self._depth -= 1
                return
            self._depth = 1
            try:
                with immediate(self._conn):
                    yield self._conn
            finally:
                self._depth = 0

    @contextmanager
    def read(self) -> Iterator[apsw.Connection]:
        deadline: float | None = getattr(self._read_deadline, "at", None)
        if deadline is None:
            with self._lock:
                yield self._conn
            return
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise StoreBusy("the metadata store is held by another transaction")
        try:
            if self._depth:  # this thread's own transaction: nothing to wait for
                yield self._conn
                return
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise StoreBusy("the metadata store is held by another transaction")
            self._conn.setbusytimeout(min(left_ms, self._busy_ms))
            try:
                yield self._conn
            finally:
                self._conn.setbusytimeout(self._busy_ms)
        finally:
            self._lock.release()

    @contextmanager
    def reads_until(self, deadline: float) -> Iterator[None]:
        """Reads of this thread in the block wait for the store no later than
        ``deadline`` (``time.monotonic()``): for the lock another thread's transaction
        holds, then for SQLite's (its busy timeout cut to what is left). Past it a read
        raises ``StoreBusy`` (SQLite's own ``BusyError`` once it started), so a caller
        with a time budget gives up instead of holding its thread."""
        previous = getattr(self._read_deadline, "at", None)
        self._read_deadline.at = deadline
        try:
            yield
        finally:
            self._read_deadline.at = previous

    # -- reads (every one filtered by org) ----------------------------------------------
    def policy(self, org: str) -> tuple[bool, int]:
        """(allow_self_approval, version); version 0 = never set (the default: refused)."""
        with self.read() as c:
            row = c.execute(
                "SELECT allow_self_approval, version FROM policy WHERE org = ?", (org,)
            ).fetchone()
        return (bool(row[0]), int(row[1])) if row else (False, 0)

    def topic(self, org: str, topic_id: str) -> TopicRow | None:
        with self.read() as c:
            row = c.execute(
                f"SELECT {_TOPIC} FROM topics WHERE org = ? AND id = ?",  # noqa: S608 - constant column list
                (org, topic_id),
            ).fetchone()
        return _topic(row) if row else None

    def topics(self, org: str, *, after: str = "", limit: int = 100) -> list[TopicRow]:
        with self.read() as c:
            rows = c.execute(
                f"SELECT {_TOPIC} FROM topics WHERE org = ? AND knowledge_key > ?"  # noqa: S608 - constant column list
                " ORDER BY knowledge_key LIMIT ?",
                (org, after, limit),
            ).fetchall()
        return [_topic(r) for r in rows]

    def revision(self, org: str, revision_id: str) -> RevisionRow | None:
        with self.read() as c:
            row = c.execute(
                f"SELECT {_REVISION} FROM revisions WHERE org = ? AND id = ?",  # noqa: S608 - constant column list
                (org, revision_id),
            ).fetchone()
        return _revision(row) if row else None

    def revisions(self, org: str, topic_id: str) -> list[RevisionRow]:
        with self.read() as c:
            rows = c.execute(
                f"SELECT {_REVISION} FROM revisions WHERE org = ? AND topic_id = ?"  # noqa: S608 - constant column list
                " ORDER BY created_at, id",
                (org, topic_id),
            ).fetchall()
        return [_revision(r) for r in rows]

    def revisions_in_states(self, org: str | None, states: Sequence[str]) -> list[RevisionRow]:
        """Revisions in ``states`` of one organisation, or of every one (``org=None``:
        only the server's own reconcile and start-up recovery, never a caller)."""
        marks = ",".join("?" for _ in states)
        with self.read() as c:
            if org is None:
                rows = c.execute(
                    f"SELECT {_REVISION} FROM revisions WHERE state IN ({marks})",  # noqa: S608 - constant column list and placeholders
                    tuple(states),
                ).fetchall()
            else:
                rows = c.execute(
                    f"SELECT {_REVISION} FROM revisions WHERE org = ? AND state IN ({marks})",  # noqa: S608 - constant column list and placeholders
                    (org, *states),
                ).fetchall()
        return [_revision(r) for r in rows]

    def sources(self, org: str, revision_id: str) -> list[SourceRow]:
        with self.read() as c:
            rows = c.execute(
                f"SELECT {_SOURCE} FROM sources WHERE org = ? AND revision_id = ?"  # noqa: S608 - constant column list
                " ORDER BY ordinal",
                (org, revision_id),
            ).fetchall()
        return [_source(r) for r in rows]

    def tag(self, org: str, code: str) -> TagRow | None:
        with self.read() as c:
            row = c.execute(
                f"SELECT {_TAG} FROM tags WHERE org = ? AND code = ?",  # noqa: S608 - constant column list
                (org, code),
            ).fetchone()
        return _tag(row) if row else None

    def tags(self, org: str, *, include_inactive: bool = True) -> list[TagRow]:
        with self.read() as c:
            rows = c.execute(
                f"SELECT {_TAG} FROM tags WHERE org = ? AND (active = 1 OR ?)"  # noqa: S608 - constant column list
                " ORDER BY sort_order, code",
                (org, int(include_inactive)),
            ).fetchall()
        return [_tag(r) for r in rows]

    def template(self, org: str, code: str) -> TemplateRow | None:
        with self.read() as c:
            row = c.execute(
                f"SELECT {_TEMPLATE} FROM templates WHERE org = ? AND code = ?",  # noqa: S608 - constant column list
                (org, code),
            ).fetchone()
        return _template(row) if row else None

    def templates(self, org: str) -> list[TemplateRow]:
        with self.read() as c:
            rows = c.execute(
                f"SELECT {_TEMPLATE} FROM templates WHERE org = ? ORDER BY code",  # noqa: S608 - constant column list
                (org,),
            ).fetchall()
        return [_template(r) for r in rows]

    def feedback_item(self, org: str, feedback_id: str) -> FeedbackRow | None:
        with self.read() as c:
            row = c.execute(
                f"SELECT {_FEEDBACK} FROM feedback WHERE org = ? AND id = ?",  # noqa: S608 - constant column list
                (org, feedback_id),
            ).fetchone()
        return _feedback(row) if row else None

    def feedback(self, org: str, *, status: str = "", limit: int = 100) -> list[FeedbackRow]:
        with self.read() as c:
            rows = c.execute(
                f"SELECT {_FEEDBACK} FROM feedback WHERE org = ? AND (? = '' OR status = ?)"  # noqa: S608 - constant column list
                " ORDER BY created_at DESC, id LIMIT ?",
                (org, status, status, limit),
            ).fetchall()
        return [_feedback(r) for r in rows]

    def release(self, org: str, topic_id: str) -> str:
        """The topic's visible revision id; '' when none (never published, or offline)."""
        with self.read() as c:
            row = c.execute(
                "SELECT revision_id FROM releases WHERE org = ? AND topic_id = ?", (org, topic_id)
            ).fetchone()
        return str(row[0]) if row else ""

    def published_revision_ids(self, org: str) -> frozenset[str]:
        """The revisions a reader of ``org`` may see: one per topic with a release."""
        with self.read() as c:
            rows = c.execute(
                "SELECT revision_id FROM releases WHERE org = ? AND revision_id != ''", (org,)
            ).fetchall()
        return frozenset(str(r[0]) for r in rows)

    def published_embed_models(self, org: str) -> dict[str, tuple[str, frozenset[str]]]:
        """The revisions a reader of ``org`` may see (``published_revision_ids``), each
        with the identity of the embedder its vectors were made by and its tag codes (the
        ones its chunks carry in the index, which tag filters select by)."""
        with self.read() as c:
            rows = c.execute(
                "SELECT rel.revision_id, coalesce(r.embed_model, ''), coalesce(r.tags, '[]')"
                " FROM releases rel"
                " LEFT JOIN revisions r ON r.id = rel.revision_id AND r.org = rel.org"
                " WHERE rel.org = ? AND rel.revision_id != ''",
                (org,),
            ).fetchall()
        return {str(r[0]): (str(r[1]), frozenset(json.loads(str(r[2])))) for r in rows}

    def citable_revisions(
        self, org: str, revision_ids: Sequence[str]
    ) -> dict[str, CitableRevision]:
        """Of ``revision_ids``, those that are their topic's release in ``org`` now, with
        what a citation of them needs; one read transaction, so the answer is one moment's
        state of the releases."""
        ids = sorted(set(revision_ids))
        if not ids:
            return {}
        out: dict[str, CitableRevision] = {}
        with self.read() as c:
            rows = c.execute(
                "SELECT r.id, r.topic_id, r.version_label, r.chunk_count, t.title"
                " FROM releases rel"
                " JOIN revisions r ON r.id = rel.revision_id AND r.org = rel.org"
                " JOIN topics t ON t.id = r.topic_id AND t.org = r.org"
                " WHERE rel.org = ? AND rel.topic_id = r.topic_id"
                " AND rel.revision_id IN (SELECT value FROM json_each(?))",
                (org, json.dumps(ids)),
            ).fetchall()
            sources: dict[str, set[str]] = {}
            for src, rev in c.execute(
                "SELECT id, revision_id FROM sources WHERE org = ?"
                " AND revision_id IN (SELECT value FROM json_each(?))",
                (org, json.dumps(ids)),
            ):
                sources.setdefault(str(rev), set()).add(str(src))
        for rid, topic_id, label, count, title in rows:
            out[str(rid)] = CitableRevision(
                revision_id=str(rid),
                topic_id=str(topic_id),
                version_label=str(label),
                chunk_count=int(count or 0),
                topic_title=str(title),
                source_ids=frozenset(sources.get(str(rid), ())),
            )
        return out

    def release_history(self, org: str, topic_id: str) -> list[tuple[str, str, str, str, str]]:
        """(revision_id, previous_id, action, principal, at), oldest first."""
        with self.read() as c:
            rows = c.execute(
                "SELECT revision_id, previous_id, action, principal, at FROM release_history"
                " WHERE org = ? AND topic_id = ? ORDER BY seq",
                (org, topic_id),
            ).fetchall()
        return [(str(a), str(b), str(c_), str(d), str(e)) for a, b, c_, d, e in rows]

    def task(self, org: str, task_id: str) -> TaskRow | None:
        with self.read() as c:
            row = c.execute(
                f"SELECT {_TASK} FROM tasks WHERE org = ? AND id = ?",  # noqa: S608 - constant column list
                (org, task_id),
            ).fetchone()
        return _task(row) if row else None

    def task_by_key(self, org: str, key: str) -> TaskRow | None:
        with self.read() as c:
            row = c.execute(
                f"SELECT {_TASK} FROM tasks WHERE org = ? AND idempotency_key = ?",  # noqa: S608 - constant column list
                (org, key),
            ).fetchone()
        return _task(row) if row else None

    def tasks_of(self, org: str, revision_id: str) -> list[TaskRow]:
        with self.read() as c:
            rows = c.execute(
                f"SELECT {_TASK} FROM tasks WHERE org = ? AND revision_id = ?"  # noqa: S608 - constant column list
                " ORDER BY created_at, id",
                (org, revision_id),
            ).fetchall()
        return [_task(r) for r in rows]

    def tasks_in_state(self, state: str) -> list[TaskRow]:
        """Tasks of every organisation in ``state``: the worker's own view of the queue."""
        with self.read() as c:
            rows = c.execute(
                f"SELECT {_TASK} FROM tasks WHERE state = ? ORDER BY created_at, id",  # noqa: S608 - constant column list
                (state,),
            ).fetchall()
        return [_task(r) for r in rows]

    def embed_calls(self, org: str, task_id: str) -> list[tuple[str, int, float, str]]:
        """(model, texts, ms, failure) per embedding call of a task."""
        with self.read() as c:
            rows = c.execute(
                "SELECT model, texts, ms, failure FROM embed_calls WHERE org = ? AND task_id = ?"
                " ORDER BY id",
                (org, task_id),
            ).fetchall()
        return [(str(r[0]), int(str(r[1])), float(str(r[2])), str(r[3])) for r in rows]

    # -- blobs ---------------------------------------------------------------------------
    def blob_path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(ch not in "0123456789abcdef" for ch in sha256):
            raise ValueError("not a SHA-256 hex digest")
        return self.blob_dir / sha256[:2] / sha256

    def upload_part(self, upload_id: str) -> Path:
        if not upload_id.startswith("up_") or not upload_id[3:].isalnum():
            raise ValueError("not an upload id")
        return self.upload_dir / f"{upload_id}.part"

    def keep_blob(self, part: Path) -> tuple[str, int]:
        """Keep a finished upload in the blob folder under its SHA-256 (a hard link; the
        part file is left for its owner to remove); returns (sha256, size). Written once:
        the same bytes uploaded again reuse the blob."""
        digest = hashlib.sha256()
        size = 0
        with part.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
        sha = digest.hexdigest()
        target = self.blob_path(sha)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            tmp = target.with_suffix(f".{secrets.token_hex(4)}.tmp")
            try:
                os.link(part, tmp)
            except OSError:
                shutil.copyfile(part, tmp)
            os.replace(tmp, target)
        return sha, size
