"""Plain data types of the episodes lane (importers, store and search share them)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Harness = Literal["claude-code", "codex", "opencode", "aider", "generic"]
Outcome = Literal["success", "failure", "unknown"]

# Importers multiply the physical line number by this so that one JSONL record may
# yield several events (e.g. an assistant record with text + tool_use blocks) while
# ``seq`` stays a stable function of the file content that already exists.
SEQ_STRIDE = 1000


@dataclass(slots=True)
class Event:
    """One searchable step of a session, as produced by an importer."""

    session_id: str
    seq: int
    event_type: str
    text: str
    time: datetime | None = None
    is_error: bool = False
    tool_name: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # "success" / "failure" when this event decides how the session ended (see docs).
    signal: str | None = None


@dataclass(slots=True)
class SessionMeta:
    """Session metadata; importers fill what they know, the store merges updates."""

    session_id: str
    harness: str = "generic"
    cwd: str | None = None
    created_at: datetime | None = None
    model: str | None = None
    agent_preset: str | None = None
    title: str | None = None
    parent_session_id: str | None = None
    agent_id: str | None = None
    is_sidechain: bool = False
    subagent_type: str | None = None
    spawn_depth: int | None = None
    forked_from_id: str | None = None
    persisted: bool = True
    source_path: str | None = None


@dataclass(slots=True)
class Problem:
    """A line the importer could not use: ``malformed`` (not JSON / wrong shape), ``unknown``
    type, or ``oversized`` (longer than the importer's line limit, skipped)."""

    kind: Literal["malformed", "unknown", "oversized"]
    path: str
    line: int
    detail: str

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(slots=True)
class IngestReport:
    """What one ``ingest`` call did."""

    files_seen: int = 0
    files_changed: int = 0
    files_reimported: int = 0
    events_added: int = 0
    events_duplicate: int = 0
    events_removed: int = 0
    sessions: int = 0
    sessions_touched: int = 0
    # Sessions a scoped ingest left out: their workspace lies outside its scope.
    sessions_out_of_scope: int = 0
    # Sessions a file claims whose stored workspace is another one (``ingest._conflicting``).
    sessions_conflicting: int = 0
    malformed: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    # "path:line: reason" of each line skipped for being over the line limit.
    oversized: list[str] = field(default_factory=list)
    # "path: reason" of each candidate file that was not imported (format not recognised).
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    per_file_events: dict[str, int] = field(default_factory=dict)
    index_rev: str = ""

    def merge(self, other: IngestReport) -> None:
        self.files_seen += other.files_seen
        self.files_changed += other.files_changed
        self.files_reimported += other.files_reimported
        self.events_added += other.events_added
        self.events_duplicate += other.events_duplicate
        self.events_removed += other.events_removed
        self.sessions_touched += other.sessions_touched
        self.sessions_out_of_scope += other.sessions_out_of_scope
        self.sessions_conflicting += other.sessions_conflicting
        self.malformed.extend(other.malformed)
        self.unknown.extend(other.unknown)
        self.oversized.extend(other.oversized)
        self.skipped.extend(other.skipped)
        self.errors.extend(other.errors)
        self.per_file_events.update(other.per_file_events)
        self.sessions = other.sessions or self.sessions
        self.index_rev = other.index_rev or self.index_rev


@dataclass(slots=True)
class SessionInfo:
    """Session metadata attached to every hit and listed for the derived layer."""

    session_id: str
    harness: str
    cwd: str | None
    created_at: datetime | None
    model: str | None
    agent_preset: str | None
    title: str | None
    live: bool
    persisted: bool
    outcome: str
    parent_session_id: str | None
    agent_id: str | None
    is_sidechain: bool
    subagent_type: str | None
    spawn_depth: int | None
    forked_from_id: str | None
    source_path: str | None
    event_count: int
    last_event_at: datetime | None
    # The newest event row's id: a session's events imported again (a log rewritten in
    # place) get new rows, so the derived layer sees the change even when nothing else
    # about the session did.
    max_event_id: int | None = None


@dataclass(slots=True)
class EpisodeHit:
    id: str
    session_id: str
    seq: int
    event_type: str
    time: datetime | None
    snippet: str
    score: float
    rank: int
    why: list[str]
    # None until described (``EpisodeStore.describe``), like an empty ``snippet``.
    session: SessionInfo | None
    tool_name: str | None = None
    is_error: bool = False
    row_id: int = 0  # the event's row in the store


@dataclass(slots=True)
class EventDetail:
    id: str
    session_id: str
    seq: int
    event_type: str
    time: datetime | None
    text: str
    is_error: bool
    tool_name: str | None
    meta: dict[str, Any]
    session: SessionInfo | None = None
    before: list[EventDetail] = field(default_factory=list)
    after: list[EventDetail] = field(default_factory=list)


@dataclass(slots=True)
class EventMeta:
    """An event without its text, for layers that derive skill uses and actors."""

    id: str
    session_id: str
    seq: int
    event_type: str
    tool_name: str | None
    meta: dict[str, Any]
    is_error: bool
    time: datetime | None


def event_id(session_id: str, seq: int) -> str:
    return f"ep:{session_id}:{seq}"


def parse_event_id(value: str) -> tuple[str, int]:
    """Inverse of :func:`event_id`; session ids may contain ``:`` so split from the right."""
    if not value.startswith("ep:"):
        raise ValueError("not an episode id")
    sid, _, seq = value[3:].rpartition(":")
    if not sid or not seq.lstrip("-").isdigit():
        raise ValueError("not an episode id")
    number = int(seq)
    if not -(2**63) <= number < 2**63:  # SQLite's integers are 64-bit
        raise ValueError("not an episode id")
    return sid, number


_DIGEST = re.compile(r"[0-9a-f]{64}")


def recent_digests(recent: list[Any]) -> list[str]:
    """The Codex importer's duplicate-check keys as the digests it stores: a key that is
    one already stays, a raw key (a context stored before kept the texts) becomes the
    digest of the same key, so a repeat is still found (the importer and the store's
    schema step ``004_codex_context_digests`` use this)."""
    return [
        k if _DIGEST.fullmatch(k) else hashlib.sha256(k.encode()).hexdigest()
        for k in (str(x) for x in recent)
    ]
