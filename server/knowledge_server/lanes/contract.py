"""The contract between the application and its lanes.

The application (``app.py``) and dispatch reach the lanes only through the protocols
below, collected in one :class:`Lanes` value that the application gets in its
constructor. A capability a deployment does not have is ``None`` in ``Lanes``: the
application checks for the member, never for a method (a type checker verifies every
call). The search coordinator sees less still: only :class:`~knowledge_server.search.lanes.Lane`.

Call model (``docs/architecture.md``): methods ending in ``_sync`` block and are run
by the application in a worker thread (``run_with_progress`` for the long operator
streams, ``deadline.off_loop`` for reads, within the caller's deadline); ``search`` is a
coroutine that the coordinator bounds with the lane timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from knowledge_server._gen.knowledge.v1 import (
    index_service_pb2,
    knowledge_service_pb2,
    search_pb2,
)
from knowledge_server.code.model import ChunkRecord
from knowledge_server.derived.store import Assignment, DerivedStore
from knowledge_server.episodes.store import EpisodeStore
from knowledge_server.lanes.common import ProgressFn, StorageErrors
from knowledge_server.search.lanes import Lane
from knowledge_server.search.validate import ValidSearch

Scope = tuple[str, ...] | None
"""The caller's effective workspaces: None = unrestricted, () = nothing visible."""


class Reporting(Protocol):
    """Every lane reports its state for GetStatus and releases its stores on close."""

    def status(self, scope: Scope) -> index_service_pb2.LaneStatus: ...

    def close(self) -> None: ...


class EpisodeLane(Lane, Reporting, Protocol):
    """L1: past agent sessions (the built-in implementation: ``lanes/episodes.py``)."""

    def snapshot(self) -> AbstractContextManager[EpisodeStore]:
        """A read-only view of the store for long reads (the derived rebuild)."""
        ...

    def get_episode_sync(
        self, episode_id: str, neighbours: int, workspaces: Scope
    ) -> knowledge_service_pb2.GetEpisodeResponse: ...

    def ingest_sync(
        self, paths: Sequence[str] | None, progress: ProgressFn, scope: Scope = None
    ) -> index_service_pb2.OperationSummary:
        """Ingest ``paths`` (none: the server's log folders, for a scoped caller those in
        its ``scope``); with a ``scope``, only sessions whose workspace lies in it."""
        ...

    async def follow(
        self, stop: asyncio.Event | None = None, on_change: Callable[[], None] | None = None
    ) -> None:
        """While serving: ingest what is appended to the server's log folders (live ingest),
        calling ``on_change`` after each batch that changed the store."""
        ...


class DocumentSource(Protocol):
    """What the document graph's build reads: the document chunks the code lane holds."""

    def indexed_roots(self) -> list[str]:
        """The workspaces that have a current revision."""
        ...

    def document_chunks(self, root: str, languages: Sequence[str]) -> tuple[str, list[ChunkRecord]]:
        """The current revision of ``root`` and its chunks in ``languages``."""
        ...


class CodeLane(Lane, Reporting, DocumentSource, Protocol):
    """L2: code and document chunks (``lanes/code.py``)."""

    def get_chunk_sync(
        self, chunk_id: str, scope: Scope
    ) -> knowledge_service_pb2.GetChunkResponse: ...

    def index_sync(
        self,
        root: str,
        full: bool,
        progress: ProgressFn,
        within: Callable[[str], bool] | None = None,
    ) -> index_service_pb2.OperationSummary: ...


class DerivedLane(Lane, Reporting, Protocol):
    """L3: skills, actors and assignments derived from L1 (``lanes/derived.py``)."""

    outbox: Path
    # A dispatch commit that met a full disk, for GetStatus.last_error.
    storage: StorageErrors

    def rebuild_sync(
        self, source: EpisodeLane, full: bool, progress: ProgressFn, scope: Scope = None
    ) -> index_service_pb2.OperationSummary:
        """Rebuild from ``source``'s store, read through ``source.snapshot()``; the
        summary's counts and problems are those within ``scope``."""
        ...

    def build_actors(
        self, resp: search_pb2.SearchResponse, v: ValidSearch, scope: Scope = None
    ) -> list[search_pb2.Actor]:
        """The actors behind ``resp``'s items; only those whose workspace lies in
        ``scope`` (an actor made of sessions the caller cannot all see is not one)."""
        ...

    def episode_actors(self, episode_ids: Sequence[str]) -> dict[str, str]: ...

    def dispatch_info(self, kind: str, harness: str) -> search_pb2.DispatchInfo:
        """How an actor of ``kind`` on ``harness`` could receive a task here."""
        ...

    def built_store(self) -> AbstractContextManager[DerivedStore | None]:
        """A reader for dispatch planning; None until the first build."""
        ...

    def record_assignment(
        self, actor_id: str, task_hash: str, outbox_path: str, task_key: str | None = None
    ) -> tuple[Assignment, bool]:
        """Record a committed dispatch, on the lane's own writer (the store's one writer)."""
        ...


class DocGraphLane(Reporting, Protocol):
    """The document graph (Enterprise; ``lanes/docgraph.py``). Not a search lane of its own:
    Search reaches it through the code lane in ``mode=docs|themes`` (``GraphDocsLane``)."""

    def op_sync(self, op: str, req: Any, scope: Scope) -> Any: ...

    def layer_revisions(self) -> tuple[tuple[str, int], ...]: ...

    def match_sync(self, query: str, level: str, scope: Scope, limit: int) -> dict[str, Any]: ...

    def build_sync(
        self,
        root: str | None,
        estimate: bool,
        max_chunks: int,
        budget_seconds: float,
        structural_only: bool,
        progress: ProgressFn,
        scope: Scope = None,
    ) -> index_service_pb2.OperationSummary: ...


@dataclass(frozen=True)
class Lanes:
    """The lanes a running application has. A missing member means the capability is
    absent: its search lane answers KNOWLEDGE_INDEX_NOT_READY and its operations
    answer UNIMPLEMENTED."""

    episodes: EpisodeLane | None = None
    code: CodeLane | None = None
    skills: DerivedLane | None = None
    docgraph: DocGraphLane | None = None

    def reporting(self) -> list[tuple[str, Reporting | None]]:
        """The lanes in GetStatus order (the document graph only when present)."""
        out: list[tuple[str, Reporting | None]] = [
            ("episodes", self.episodes),
            ("code", self.code),
            ("skills", self.skills),
        ]
        if self.docgraph is not None:
            out.append(("docgraph", self.docgraph))
        return out
