"""The application layer: plain Python behind the gRPC servicers.

It owns the lanes (one :class:`~knowledge_server.lanes.contract.Lanes` value, given to its
constructor), the coordinator and the licence/edition view, and knows nothing about
gRPC except the protobuf messages it takes and returns: the caller's principal comes
in as a plain argument (``docs/architecture.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from knowledge_licensing import FEATURE_DOC_GRAPH

from knowledge_server import __version__, deadline
from knowledge_server._gen.knowledge.v1 import (
    dispatch_pb2,
    index_service_pb2,
    kb_retrieve_pb2,
    knowledge_service_pb2,
    search_pb2,
)
from knowledge_server.audit import AuditEvent, AuditLog
from knowledge_server.auth_model import LOCAL_PRINCIPAL, Principal
from knowledge_server.config import Config
from knowledge_server.dispatch import Committer, dispatcher_for, validate_dispatch
from knowledge_server.docgraph.llm import make_client
from knowledge_server.edition import LicenceView
from knowledge_server.errors import (
    DeadlineExceeded,
    InvalidRequest,
    KnowledgeError,
    PermissionDenied,
    Unimplemented,
    as_storage_full,
)
from knowledge_server.kb.admin import KnowledgeBaseAdmin
from knowledge_server.kb.api import KnowledgeBaseApi
from knowledge_server.kb.deps import HttpReranker
from knowledge_server.kb.index.port import SearchIndex
from knowledge_server.kb.retrieve import Retriever, RetrieveSettings
from knowledge_server.kb.service import KnowledgeBase
from knowledge_server.lanes.common import ProgressFn, run_with_progress
from knowledge_server.lanes.contract import Lanes
from knowledge_server.lanes.docgraph import GraphDocsLane, llm_settings_from_config
from knowledge_server.logs import get_logger
from knowledge_server.memory.ops import WRITES, MemoryOps
from knowledge_server.memory.store import DB_FILE as MEMORY_DB
from knowledge_server.memory.store import MemoryStore
from knowledge_server.search.coordinator import Coordinator
from knowledge_server.search.lanes import Lane, NotReadyLane
from knowledge_server.search.validate import validate_search
from knowledge_server.workspaces import (
    is_under,
    normalise_workspace,
    real_path_in_scope,
    really_in_scope,
)

M = TypeVar("M", bound=Message)

# Least time between two derived rebuilds that follow ingests nobody waits for (ingested()).
REBUILD_AFTER_INGEST_S = 10.0

# The audit log's name of each operator stream's operation.
_AUDITED_STREAMS = {
    "index_workspace": "index",
    "ingest_sessions": "ingest",
    "rebuild_derived": "derived.rebuild",
    "build_doc_graph": "docgraph.build",
}
# The operator streams whose work stops when its lane is closed (an index between two
# batches, an ingest before its next file): shutdown waits for their audit event. The
# others (a document graph build, a derived rebuild) run on to their end, and waiting for
# them would hold the serving loop.
_STOPPED_ON_CLOSE = frozenset({"index", "ingest"})

# Why each search lane is empty when a deployment has no such lane.
_NOT_READY = {
    "episodes": "no session logs have been ingested yet",
    "code": "no workspace has been indexed yet",
    "skills": "the skill catalog has not been built yet",
}


def effective_workspaces(
    principal: Principal, requested: tuple[str, ...]
) -> tuple[str, ...] | None:
    """The caller's scope: a request can narrow the principal's workspaces, never widen them.

    None = unrestricted (a principal allowed everything and no filter given);
    () = nothing visible (every requested root lies outside the principal's)."""
    wanted = tuple(dict.fromkeys(normalise_workspace(w) for w in requested))
    allowed = principal.workspaces
    if allowed is None:
        return wanted or None
    allowed_n = tuple(normalise_workspace(a) for a in allowed)
    if not wanted:
        return allowed_n
    return tuple(w for w in wanted if any(is_under(w, a) for a in allowed_n))


def _request_dict(req: Message) -> dict[str, Any]:
    """A request as the audit log hashes it (canonical JSON of its proto field names)."""
    return json_format.MessageToDict(req, preserving_proto_field_name=True)


# How long shutdown waits for operator streams' work to end and record its event before it
# closes the audit log: the lanes stop that work between two files or batches first.
WORK_END_S = 10.0


class _AuditedWork:
    """The audit event of one operator stream's work, appended by the thread that runs
    the work as soon as it ends, whether or not anyone still reads the stream: ``ok`` with
    the revision it produced, or the error's reason (``KNOWLEDGE_INTERNAL`` for an
    unexpected one)."""

    def __init__(
        self,
        app: KnowledgeApp,
        principal: Principal,
        operation: str,
        targets: list[str],
        input: dict[str, Any],
    ) -> None:
        self.app = app
        self.principal = principal
        self.operation = operation
        self.targets = targets
        self.input = input
        self.recorded = False
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._succeeded = False
        self._then: Callable[[], None] | None = None

    def then(self, action: Callable[[], None]) -> None:
        """Call ``action`` on the event loop once the work has succeeded: now if it has,
        else when it does (never if it fails). Called on the loop."""
        with self._lock:
            if not self._succeeded:
                self._then = action
                return
        action()

    def _done(self) -> None:
        with self._lock:
            self._succeeded = True
            action, self._then = self._then, None
        if action is not None:
            self._loop.call_soon_threadsafe(action)

    def of(
        self, work: Callable[[ProgressFn], index_service_pb2.OperationSummary]
    ) -> Callable[[ProgressFn], index_service_pb2.OperationSummary]:
        """``work``, followed by its audit event."""

        def run(progress: ProgressFn) -> index_service_pb2.OperationSummary:
            if self.operation not in _STOPPED_ON_CLOSE:
                return audited(progress)
            with self.app.work_running():
                return audited(progress)

        def audited(progress: ProgressFn) -> index_service_pb2.OperationSummary:
            try:
                summary = work(progress)
            except Exception as exc:
                self.recorded = True
                self.app.append_failure(
                    self.principal,
                    self.operation,
                    targets=self.targets,
                    input=self.input,
                    outcome=exc.reason if isinstance(exc, KnowledgeError) else "KNOWLEDGE_INTERNAL",
                )
                raise
            done = [*self.targets, summary.index_rev] if summary.index_rev else self.targets
            self.recorded = True
            try:
                self.app.append_event(
                    self.principal, self.operation, targets=done, input=self.input
                )
            finally:
                self._done()
            return summary

        return run


W = TypeVar("W")


class _AuditedWrite(Generic[W]):
    """One write and its audit event, appended by the thread that runs it, as soon as it
    ends: a write still running when the caller's deadline passes finishes (the caller gets
    DEADLINE_EXCEEDED) and is recorded as it ended. Exactly one event: the write's, or,
    when the deadline passed before it began, the caller's (``abandon``). ``work`` returns
    the answer, the ids it touched and its outcome."""

    def __init__(
        self,
        app: KnowledgeApp,
        principal: Principal,
        operation: str,
        input: dict[str, Any],
        work: Callable[[], tuple[W, list[str], str]],
    ) -> None:
        self.app, self.principal, self.operation, self.input = app, principal, operation, input
        self._work = work
        self._gate = deadline.BeganGate()

    def run(self) -> W:
        if not self._gate.begin():
            raise DeadlineExceeded(deadline.MESSAGE)
        try:
            out, targets, outcome = self._work()
        except Exception as exc:
            reason = exc.reason if isinstance(exc, KnowledgeError) else "KNOWLEDGE_INTERNAL"
            self.app.append_failure(
                self.principal, self.operation, input=self.input, outcome=reason
            )
            raise
        self.app.append_event(
            self.principal, self.operation, targets=targets, input=self.input, outcome=outcome
        )
        return out

    def abandon(self) -> bool:
        """Called when the caller gets an error: True (and the write will never begin) if
        it had not begun, so the caller's side records the event."""
        return self._gate.abandon()

    async def __call__(self, pool: str) -> W:
        """Run the write in ``pool`` within the caller's deadline; audited either way."""
        try:
            return await deadline.off_loop(self.run, pool=pool)
        except KnowledgeError as exc:
            if self.abandon():
                await self.app.record_failure(
                    self.principal, self.operation, input=self.input, outcome=exc.reason
                )
            raise


def _root_arg(value: str, field: str = "root") -> str:
    """A request's ``root`` (or one of its ``paths``) as a normalised path; one with a NUL
    character names no file (the operating system refuses it) and is refused before any
    path call sees it (a home-relative one, ``~user\x00``, raised in the user lookup)."""
    if "\x00" in value:
        raise InvalidRequest(
            f"{field}: a path cannot contain a NUL character", metadata={"field": field}
        )
    return normalise_workspace(value)


def retrieve_settings(config: Config) -> RetrieveSettings:
    return RetrieveSettings(
        total_timeout_ms=config.retrieve_total_timeout_ms,
        default_top_k=config.retrieve_default_top_k,
        max_top_k=config.retrieve_max_top_k,
        max_query_chars=config.retrieve_max_query_chars,
        max_retries=config.retrieve_max_retries,
        min_rerank_score=config.retrieve_min_rerank_score,
        min_term_coverage=config.retrieve_min_term_coverage,
        no_evidence_reply=config.answer_no_evidence_reply,
    )


def retriever_from_config(config: Config, kb: KnowledgeBase) -> Retriever:
    """Retrieval over ``kb``'s store and index with the configured reranker and chat
    model (the document graph's ``llm_*`` settings)."""
    reranker = None
    if config.rerank_url:
        reranker = HttpReranker(
            config.rerank_url,
            config.rerank_model,
            api=config.rerank_api,
            api_key_env=config.rerank_key_env,
            max_chars=config.rerank_max_chars,
        )
    index = kb.index if isinstance(kb.index, SearchIndex) else None
    return Retriever(
        kb.store,
        index,
        kb.embedder,
        reranker=reranker,
        llm=make_client(llm_settings_from_config(config)),
        settings=retrieve_settings(config),
    )


class KnowledgeApp:
    """Everything a serving process answers with. ``lanes`` are the capabilities it has;
    ``coordinator`` defaults to one over those lanes (tests pass their own to search
    stand-in lanes)."""

    def __init__(
        self,
        config: Config,
        *,
        lanes: Lanes | None = None,
        licence: LicenceView | None = None,
        coordinator: Coordinator | None = None,
        kb: KnowledgeBase | None = None,
        retriever: Retriever | None = None,
    ) -> None:
        self.config = config
        self.started_at = datetime.now(UTC)
        self.licence = licence or LicenceView()
        self.lanes = lanes or Lanes()
        self._audit: AuditLog | None = None
        # Operator streams' work (with its audit event) running in threads: ``close``
        # closes the audit log once none is left (``work_running``).
        self._works = threading.Condition()
        self._works_running = 0
        # Operator streams' work threads open the log too (_AuditedWork): once, under this.
        self._audit_lock = threading.Lock()
        # The derived layer's rebuild after ingests nobody waits for (ingested()).
        self._rebuild: asyncio.Task[None] | None = None
        self._rebuild_again = False
        self._rebuild_started: float | None = None  # the event loop's time
        self._rebuilding = False  # in after_ingest, not waiting out the interval
        # The rebuilds that follow an IngestSessions, held until they end.
        self._followers: set[asyncio.Task[None]] = set()
        self._closing = False
        # The knowledge base (kb/): None when this deployment has none.
        self.kb = kb
        self._kb_admin = (
            KnowledgeBaseAdmin(kb, self.record, self.append_event, self.append_failure)
            if kb is not None
            else None
        )
        if retriever is None and kb is not None:
            retriever = retriever_from_config(config, kb)
        # Retrieve / Answer over the knowledge base's published releases (kb/api.py).
        self.kb_api = KnowledgeBaseApi(retriever) if retriever is not None else None
        self._memory: MemoryOps | None = None
        self.coordinator = coordinator or Coordinator(
            self._search_lanes(),
            timeout_ms=config.lane_timeout_ms,
            actor_builder=self.lanes.skills.build_actors if self.lanes.skills else None,
            episode_actors=self.lanes.skills.episode_actors if self.lanes.skills else None,
            actors_revision=self.lanes.skills.revision if self.lanes.skills else None,
        )

    def _search_lanes(self) -> dict[str, Lane]:
        code: Lane | None = self.lanes.code
        if self.lanes.code is not None and self.lanes.docgraph is not None:
            # mode=docs|themes through the document graph when it is built and licensed.
            code = GraphDocsLane(
                self.lanes.code,
                self.lanes.docgraph,
                lambda: FEATURE_DOC_GRAPH in self.licence.edition().features,
            )
        present: dict[str, Lane | None] = {
            "episodes": self.lanes.episodes,
            "code": code,
            "skills": self.lanes.skills,
        }
        return {
            name: lane if lane is not None else NotReadyLane(name, _NOT_READY[name])
            for name, lane in present.items()
        }

    # -- KnowledgeService -------------------------------------------------------------
    async def search(
        self, req: search_pb2.SearchRequest, principal: Principal
    ) -> search_pb2.SearchResponse:
        valid = validate_search(req)
        scope = effective_workspaces(principal, valid.workspaces)
        # Lanes read on the loop, each within its lane deadline and the caller's, whichever
        # comes first (their readers stop a query there); past the caller's, the answer
        # is no use to anyone.
        with deadline.interrupted_as_deadline():
            resp = await deadline.awaited(self.coordinator.search(valid, scope))
        deadline.check()
        return resp

    async def dispatch(
        self, req: dispatch_pb2.DispatchRequest, principal: Principal
    ) -> dispatch_pb2.DispatchResponse:
        # A commit refused or failed before its write (a bad request, an actor out of
        # scope, the deadline while planning) is audited like the write itself.
        commit_asked = req.HasField("dry_run") and not req.dry_run
        try:
            valid = validate_dispatch(req)
            scope = effective_workspaces(principal, valid.workspaces)
            dispatcher = dispatcher_for(
                self.coordinator,
                self.lanes,
                self.config.data_dir,
                self.config.outbox_quota_per_principal,
            )
            # Planning reads in the request pool and searches on the loop, as Search does.
            committer = Committer.of(principal.id, principal.organisation, scope)
            with deadline.interrupted_as_deadline():
                plan = await deadline.awaited(
                    dispatcher.plan(valid, scope, None if valid.dry_run else committer)
                )
        except Exception as exc:
            if commit_asked:
                reason = exc.reason if isinstance(exc, KnowledgeError) else "KNOWLEDGE_INTERNAL"
                await self.record_failure(
                    principal, "dispatch.commit", input=_request_dict(req), outcome=reason
                )
            raise
        if valid.dry_run:
            return plan.response

        def commit() -> tuple[dispatch_pb2.DispatchResponse, list[str], str]:
            resp = dispatcher.commit(plan, valid, committer)
            assignment = resp.assignment.assignment_id if resp.HasField("assignment") else ""
            return resp, [assignment] if assignment else [], "ok" if assignment else "no_actor"

        # A commit, refused or failed, is audited like every write.
        write = _AuditedWrite(self, principal, "dispatch.commit", _request_dict(req), commit)
        with deadline.interrupted_as_deadline():
            return await write("dispatch")

    async def get_episode(
        self, req: knowledge_service_pb2.GetEpisodeRequest, principal: Principal
    ) -> knowledge_service_pb2.GetEpisodeResponse:
        lane = self.lanes.episodes
        if lane is None:
            raise Unimplemented("GetEpisode needs the built-in episodes lane")
        scope = effective_workspaces(principal, ())
        return await deadline.off_loop(
            lane.get_episode_sync, req.id, req.neighbours, scope, pool="episodes"
        )

    async def get_chunk(
        self, req: knowledge_service_pb2.GetChunkRequest, principal: Principal
    ) -> knowledge_service_pb2.GetChunkResponse:
        lane = self.lanes.code
        if lane is None:
            raise Unimplemented("GetChunk needs the built-in code lane")
        scope = effective_workspaces(principal, ())
        return await deadline.off_loop(lane.get_chunk_sync, req.id, scope, pool="code")

    # -- DocGraphService ---------------------------------------------------------------
    async def docgraph(self, op: str, req: Message, principal: Principal, response: type[M]) -> M:
        """One document-graph operation; ``response`` is the message type it answers with."""
        lane = self.lanes.docgraph
        if lane is None:
            raise Unimplemented(f"{op} (document graph) needs the built-in docgraph lane")
        scope = effective_workspaces(principal, ())
        out = await deadline.off_loop(lane.op_sync, op, req, scope, pool="docgraph")
        if not isinstance(out, response):
            raise TypeError(f"{op} answered {type(out).__name__}, not {response.__name__}")
        return out

    # -- IndexService ------------------------------------------------------------------
    async def index_stream(
        self, op: str, req: Any, principal: Principal
    ) -> AsyncIterator[index_service_pb2.OperationSummary | index_service_pb2.Progress]:
        """An operator stream and its audit event (the operation, the root or paths it
        was given, the revision it produced, its outcome). The work's event is written by
        the work's own thread when it ends (``_AuditedWork``), so a caller that goes away
        mid-stream, while the work runs on to its commit, leaves no write unaudited; a
        refusal before any work is recorded here."""
        operation = _AUDITED_STREAMS.get(op, op)
        targets = [str(t) for t in ([req.root] if getattr(req, "root", "") else [])]
        targets += [str(p) for p in getattr(req, "paths", [])]
        audited = _AuditedWork(self, principal, operation, targets, _request_dict(req))
        try:
            async for event in self._index_stream(op, req, principal, audited):
                yield event
        except KnowledgeError as exc:
            if not audited.recorded:
                await self.record_failure(
                    principal, operation, targets=targets, input=audited.input, outcome=exc.reason
                )
            raise

    async def _index_stream(  # noqa: C901 - one branch per index operation, each with its precondition
        self, op: str, req: Any, principal: Principal, audited: _AuditedWork
    ) -> AsyncIterator[index_service_pb2.OperationSummary | index_service_pb2.Progress]:
        scope = effective_workspaces(principal, ())
        if op == "build_doc_graph":
            graph = self.lanes.docgraph
            if graph is None:
                raise Unimplemented("BuildDocGraph needs the built-in docgraph lane")
            root = _root_arg(req.root) if req.root else None
            # Real paths, as for IndexWorkspace: a root through a link out of the
            # principal's workspaces is outside them, whatever its string says.
            if root is not None and scope is not None and not really_in_scope(root, scope):
                raise PermissionDenied("root: outside the workspaces this principal may manage")
            async for event in run_with_progress(
                audited.of(
                    lambda progress: graph.build_sync(
                        root,
                        req.estimate,
                        req.max_chunks,
                        req.budget_seconds,
                        req.structural_only,
                        progress,
                        scope,
                    )
                )
            ):
                yield event
            return
        if op == "ingest_sessions":
            episodes = self.lanes.episodes
            if episodes is None:
                raise Unimplemented("IngestSessions needs the built-in episodes lane")
            paths = [_root_arg(p, "paths") for p in req.paths]
            for p in paths:
                # A path outside a scoped operator's workspaces (by its real path) is answered
                # exactly as a missing one: the error says nothing about what exists elsewhere.
                visible = really_in_scope(p, scope)
                if not visible or not os.path.exists(p):  # noqa: ASYNC240 - one stat per path, before any work
                    raise InvalidRequest(
                        f"paths: {p} does not exist on the server", metadata={"field": "paths"}
                    )
            rebuild: asyncio.Task[None] | None = None
            try:
                async for event in run_with_progress(
                    audited.of(
                        lambda progress: episodes.ingest_sync(paths or None, progress, scope)
                    )
                ):
                    yield event
                # Its own task: a caller who goes away now leaves the rebuild running to
                # its end, once (asking for another in its place rebuilt twice).
                rebuild = asyncio.get_running_loop().create_task(self.after_ingest())
                self._followers.add(rebuild)
                rebuild.add_done_callback(self._follower_ended)
                await asyncio.shield(rebuild)
            finally:
                if rebuild is None:
                    # The caller went away during the ingest: the derived layer is rebuilt
                    # once the ingest has written, without it.
                    audited.then(self.ingested)
            return
        if op == "index_workspace":
            code = self.lanes.code
            if code is None:
                raise Unimplemented("IndexWorkspace needs the built-in code lane")
            if not req.root:
                raise InvalidRequest(
                    "root: an absolute workspace path is required", metadata={"field": "root"}
                )
            root = _root_arg(req.root)
            # Real paths: a root that is, or passes through, a symlink leaving the
            # principal's workspaces is outside them (the walker then never follows links).
            if scope is not None and not really_in_scope(root, scope):
                raise PermissionDenied("root: outside the workspaces this principal may manage")
            # Asked again of the folder the indexer opens, under its lock: the name may be
            # pointed elsewhere in between.
            within = None if scope is None else functools.partial(real_path_in_scope, scope=scope)
            async for event in run_with_progress(
                audited.of(lambda progress: code.index_sync(root, req.full, progress, within))
            ):
                yield event
            return
        if op == "rebuild_derived":
            skills, source = self.lanes.skills, self.lanes.episodes
            if skills is None or source is None:
                raise Unimplemented("RebuildDerived needs the built-in skills and episodes lanes")
            async for event in run_with_progress(
                audited.of(lambda progress: skills.rebuild_sync(source, req.full, progress, scope))
            ):
                yield event
            return
        raise Unimplemented(f"{op} is declared in knowledge.v1 but not built in this server yet")

    async def after_ingest(self) -> None:
        """The derived layer is rebuilt incrementally after each ingestion."""
        async for _ in self.index_stream(
            "rebuild_derived", index_service_pb2.RebuildDerivedRequest(), LOCAL_PRINCIPAL
        ):
            pass

    def _follower_ended(self, task: asyncio.Task[None]) -> None:
        """The rebuild after an IngestSessions ended: one that failed or was cut short is
        asked again in the background (the ingest has written)."""
        self._followers.discard(task)
        if task.cancelled() or task.exception() is not None:
            self.ingested()

    def ingested(self) -> None:
        """An ingest wrote and nobody waits for its derived rebuild (a batch of the live
        ingest, an IngestSessions whose caller went away): rebuild in the background, one
        at a time; asked again meanwhile, once more when it ends, at most every
        REBUILD_AFTER_INGEST_S (a harness that keeps writing is ingested every second)."""
        if self._closing:
            return
        if self._rebuild is not None and not self._rebuild.done():
            self._rebuild_again = True
            return
        self._rebuild_again = False
        self._rebuild = asyncio.get_running_loop().create_task(self._rebuild_after_ingest())

    async def _rebuild_after_ingest(self) -> None:
        log = get_logger("knowledge.derived")
        loop = asyncio.get_running_loop()
        while True:
            if self._rebuild_started is not None:
                wait = self._rebuild_started + REBUILD_AFTER_INGEST_S - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)  # what is asked meanwhile joins this rebuild
            if self._closing:
                return
            self._rebuild_again = False
            self._rebuild_started = loop.time()
            self._rebuilding = True
            try:
                await self.after_ingest()
            except Exception as exc:  # noqa: BLE001 - kept for GetStatus by the lane; the next ingest tries again
                log.error("derived.rebuild_failed", error_type=type(exc).__name__)
            finally:
                self._rebuilding = False
            if not self._rebuild_again or self._closing:
                return

    async def settle(self, grace: float) -> None:
        """Before the stores close: no new background rebuild, and the running ones (the
        background one, those following an IngestSessions; their work is in a thread that
        cancelling would not stop) get ``grace`` seconds to end; one still running then is
        cancelled, and its failure to write is logged."""
        self._closing = True
        running = [t for t in self._followers if not t.done()]
        task = self._rebuild
        if task is not None and not task.done():
            if self._rebuilding:
                running.append(task)
            else:  # waiting out the interval: nothing runs
                task.cancel()
        if not running:
            return
        _, late = await asyncio.wait(running, timeout=grace)
        if late:
            get_logger("knowledge.derived").error("derived.rebuild_cut_short", grace_s=grace)
            for t in late:
                t.cancel()

    async def bootstrap(self) -> None:
        """Start-up work in the background: ingest logs (or the bundled sample), rebuild
        the derived layer, index the workspaces. Lanes answer KNOWLEDGE_INDEX_NOT_READY
        until their part is done; a failure is logged and kept for GetStatus.

        It runs as the server itself (the local principal), not as any caller."""
        log = get_logger("knowledge.bootstrap")
        if self.lanes.episodes is not None:
            try:
                async for event in self.index_stream(
                    "ingest_sessions", index_service_pb2.IngestSessionsRequest(), LOCAL_PRINCIPAL
                ):
                    if isinstance(event, index_service_pb2.OperationSummary):
                        log.info(
                            "bootstrap.ingested",
                            events_added=event.counters["events_added"],
                            sessions=event.counters["sessions"],
                            index_rev=event.index_rev,
                        )
            except Exception as exc:  # noqa: BLE001 - the server keeps serving the other lanes
                log.error("bootstrap.ingest_failed", error_type=type(exc).__name__)
        if self.lanes.code is not None:
            for root in self.config.workspaces:
                try:
                    async for event in self.index_stream(
                        "index_workspace",
                        index_service_pb2.IndexWorkspaceRequest(root=root),
                        LOCAL_PRINCIPAL,
                    ):
                        if isinstance(event, index_service_pb2.OperationSummary):
                            log.info(
                                "bootstrap.indexed",
                                workspace=root,
                                chunks=event.counters["chunks"],
                                index_rev=event.index_rev,
                                ms=event.ms,
                            )
                except Exception as exc:  # noqa: BLE001 - the other workspaces still index
                    log.error(
                        "bootstrap.index_failed", workspace=root, error_type=type(exc).__name__
                    )

    async def status(
        self, req: index_service_pb2.GetStatusRequest, principal: Principal
    ) -> index_service_pb2.GetStatusResponse:
        resp = index_service_pb2.GetStatusResponse(version=__version__)
        resp.edition.CopyFrom(self.licence.status())
        resp.principal.id = principal.id
        resp.principal.organisation = principal.organisation
        resp.principal.role = principal.role
        resp.principal.workspaces.extend(principal.workspaces or ())
        resp.started_at.FromDatetime(self.started_at)
        scope = effective_workspaces(principal, ())
        resp.workspaces.extend(w for w in self.config.workspaces if scope is None or w in scope)
        # The lanes count their stores (within the caller's scope): SQLite reads, in a thread.
        resp.lanes.extend(await deadline.off_loop(self._lane_statuses, scope, pool="status"))
        return resp

    def _lane_statuses(self, scope: tuple[str, ...] | None) -> list[index_service_pb2.LaneStatus]:
        out = []
        for name, lane in self.lanes.reporting():
            if lane is not None:
                out.append(lane.status(scope))
            else:
                out.append(
                    index_service_pb2.LaneStatus(
                        lane=name, degraded=True, capability="degraded", reason="not built"
                    )
                )
        return out

    # -- KnowledgeBaseAdminService ---------------------------------------------------------
    async def kb_admin(self, op: str, req: Message, principal: Principal) -> Message:
        """One knowledge-base management RPC (``kb/admin.py``), audited when it writes."""
        if self._kb_admin is None:
            raise Unimplemented("this server has no knowledge base")
        return await self._kb_admin.call(op, req, principal)

    async def kb_watch(self, req: Any, principal: Principal) -> AsyncIterator[Message]:
        """WatchTask: the task's progress until it ends."""
        if self._kb_admin is None:
            raise Unimplemented("this server has no knowledge base")
        async for event in self._kb_admin.watch(req, principal):
            yield event

    # -- KnowledgeBaseService ------------------------------------------------------------
    async def kb_retrieve(
        self,
        req: kb_retrieve_pb2.RetrieveRequest,
        principal: Principal,
        trace_id: str | None = None,
    ) -> kb_retrieve_pb2.RetrieveResponse:
        """Retrieve: citable published evidence (``kb/api.py``)."""
        if self.kb_api is None:
            raise Unimplemented("this server has no knowledge base")
        return await self.kb_api.retrieve(req, principal, trace_id)

    async def kb_answer(
        self, req: kb_retrieve_pb2.AnswerRequest, principal: Principal, trace_id: str | None = None
    ) -> kb_retrieve_pb2.AnswerResponse:
        """Answer: the chat model's answer from the reranked evidence (``kb/api.py``)."""
        if self.kb_api is None:
            raise Unimplemented("this server has no knowledge base")
        return await self.kb_api.answer(req, principal, trace_id)

    # -- MemoryService -----------------------------------------------------------------
    @property
    def memory_ops(self) -> MemoryOps:
        """The fact memory (``memory.sqlite``, ``docs/memory.md``), opened on first use."""
        if self._memory is None:
            self._memory = MemoryOps(MemoryStore(self.data_path(MEMORY_DB), self.config.memory))
        return self._memory

    async def memory(self, op: str, req: Message, principal: Principal, response: type[M]) -> M:
        """One memory operation in the ``memory`` pool; every write (and every refused
        write) appends an audit event with the ids it touched; a dry run is no write.

        A write's event is appended by the thread that ran it, as soon as it ends: a write
        still running when the caller's deadline passes finishes (the caller gets
        DEADLINE_EXCEEDED) and is audited as it ended, with its ids. A write the deadline
        stopped before it began is audited here with the deadline's reason."""
        ops = self.memory_ops
        # A dry run reports what consolidation would do and writes nothing (docs/memory.md).
        if not (op in WRITES and not getattr(req, "dry_run", False)):
            out, _ = await deadline.off_loop(ops.run, op, req, principal, pool="memory")
        else:

            def work() -> tuple[Message, list[str], str]:
                answer, targets = ops.run(op, req, principal)
                return answer, targets, "ok"

            write = _AuditedWrite(self, principal, f"memory.{op}", _request_dict(req), work)
            out = await write("memory")
        if not isinstance(out, response):
            raise TypeError(f"{op} answered {type(out).__name__}, not {response.__name__}")
        return out

    # -- audit ---------------------------------------------------------------------------
    @property
    def audit(self) -> AuditLog:
        """The data directory's audit log (``docs/audit.md``), opened on first use."""
        with self._audit_lock:
            if self._audit is None:
                self._audit = AuditLog(self.data_path("audit.sqlite"))
            return self._audit

    def append_event(
        self,
        principal: Principal,
        operation: str,
        *,
        targets: tuple[str, ...] | list[str] = (),
        input: object = None,
        outcome: str = "ok",
    ) -> AuditEvent:
        """Append one audit event for a write ``principal`` made (``input`` is hashed,
        never stored), in the calling thread; a full disk is StorageFull."""
        try:
            return self.audit.append(
                principal=principal.id,
                org=principal.organisation,
                operation=operation,
                targets=list(targets),
                input=input,
                outcome=outcome,
            )
        except Exception as exc:
            full = as_storage_full(exc)
            if full is not None:
                raise full from None
            raise

    def append_failure(
        self,
        principal: Principal,
        operation: str,
        *,
        targets: tuple[str, ...] | list[str] = (),
        input: object = None,
        outcome: str,
    ) -> None:
        """``append_event`` for an operation that failed: the operation's own error is
        what the caller gets, so an event that cannot be written (e.g. the disk is full,
        which may be why the operation failed) is logged instead of replacing it."""
        try:
            self.append_event(principal, operation, targets=targets, input=input, outcome=outcome)
        except Exception as exc:  # noqa: BLE001 - the operation's error goes to the caller
            get_logger("knowledge.audit").error(
                "audit.append_failed", operation=operation, error_type=type(exc).__name__
            )

    async def record(
        self,
        principal: Principal,
        operation: str,
        *,
        targets: tuple[str, ...] | list[str] = (),
        input: object = None,
        outcome: str = "ok",
    ) -> AuditEvent:
        """``append_event`` in a thread, not bound to the call's deadline: the write it
        records has happened, so its event is written even if the caller has gone."""
        append = functools.partial(
            self.append_event, principal, operation, targets=targets, input=input, outcome=outcome
        )
        return await asyncio.shield(asyncio.to_thread(append))

    async def record_failure(
        self,
        principal: Principal,
        operation: str,
        *,
        targets: tuple[str, ...] | list[str] = (),
        input: object = None,
        outcome: str,
    ) -> None:
        """``append_failure`` in a thread, as ``record``."""
        append = functools.partial(
            self.append_failure, principal, operation, targets=targets, input=input, outcome=outcome
        )
        await asyncio.shield(asyncio.to_thread(append))

    def reload(self) -> None:
        """SIGHUP: re-read the licence."""
        self.licence.reload()

    @contextlib.contextmanager
    def work_running(self) -> Iterator[None]:
        """Around the work and audit event of an operator stream that stops when its lane
        is closed (``_STOPPED_ON_CLOSE``): ``close`` waits for it before closing the audit
        log."""
        with self._works:
            self._works_running += 1
        try:
            yield
        finally:
            with self._works:
                self._works_running -= 1
                self._works.notify_all()

    def close(self) -> None:
        """Close every store, the audit log last: work still ending in a lane's thread
        (an index run stopping between two batches, an ingest before its next file)
        appends its event as it ends, and the audit log waits for it (at most
        ``WORK_END_S``; the lanes have let go of their writers by then). One store that
        fails to close is logged and the others are closed all the same."""
        if self._rebuild is not None:
            self._rebuild.cancel()
        closers: list[tuple[str, Callable[[], None]]] = []
        if self.kb is not None:
            closers.append(("kb", self.kb.close))
        if self._memory is not None:
            closers.append(("memory", self._memory.store.close))
        for name, lane in self.lanes.reporting():
            if lane is not None:
                closers.append((name, lane.close))
        if self._audit is not None:
            closers.append(("audit", self._close_audit))
        for name, close in closers:
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - the other stores are closed still
                get_logger("knowledge.app").error(
                    "app.close_failed", store=name, error_type=type(exc).__name__
                )

    def _close_audit(self) -> None:
        with self._works:
            self._works.wait_for(lambda: self._works_running == 0, timeout=WORK_END_S)
        if self._audit is not None:
            self._audit.close()

    def data_path(self, name: str) -> Path:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        return self.config.data_dir / name
