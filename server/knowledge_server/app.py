"""The application layer: plain Python behind the gRPC servicers.

It owns the lanes, the coordinator and the licence/edition state, and knows nothing
about gRPC except the protobuf messages it takes and returns.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from knowledge_server import __version__
from knowledge_server._gen.knowledge.v1 import (
    dispatch_pb2,
    index_service_pb2,
    knowledge_service_pb2,
    search_pb2,
)
from knowledge_server.auth_model import Principal
from knowledge_server.config import Config
from knowledge_server.errors import InvalidRequest, PermissionDenied, Unimplemented
from knowledge_server.lanes.common import run_with_progress
from knowledge_server.logs import get_logger
from knowledge_server.search.coordinator import Coordinator
from knowledge_server.search.lanes import Lane, NotReadyLane
from knowledge_server.search.validate import validate_search
from knowledge_server.transport.interceptors import EditionState, current_call
from knowledge_server.workspaces import in_scope, is_under, normalise_workspace


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


class LicenceView:
    """Edition state for the gate and GetStatus. Replaced by the licence watcher at start."""

    def edition(self) -> EditionState:
        return EditionState("community", frozenset(), "missing")

    def status(self) -> index_service_pb2.EditionStatus:
        e = self.edition()
        return index_service_pb2.EditionStatus(
            edition=e.edition,
            licence_state=e.licence_state,
            reason="no licence file",
            features=sorted(e.features),
        )


class KnowledgeApp:
    def __init__(
        self,
        config: Config,
        *,
        lanes: dict[str, Lane] | None = None,
        licence: LicenceView | None = None,
    ) -> None:
        self.config = config
        self.started_at = datetime.now(UTC)
        self.licence = licence or LicenceView()
        self.lanes: dict[str, Lane] = lanes or {
            "episodes": NotReadyLane("episodes", "no session logs have been ingested yet"),
            "code": NotReadyLane("code", "no workspace has been indexed yet"),
            "skills": NotReadyLane("skills", "the skill catalog has not been built yet"),
        }
        skills = self.lanes.get("skills")
        self.coordinator = Coordinator(
            self.lanes,
            timeout_ms=config.lane_timeout_ms,
            actor_builder=getattr(skills, "build_actors", None),
            episode_actors=getattr(skills, "episode_actors", None),
        )

    # -- KnowledgeService -------------------------------------------------------------
    async def search(self, req: search_pb2.SearchRequest) -> search_pb2.SearchResponse:
        valid = validate_search(req)
        scope = effective_workspaces(current_call().principal, valid.workspaces)
        return await self.coordinator.search(valid, scope)

    async def dispatch(self, req: dispatch_pb2.DispatchRequest) -> dispatch_pb2.DispatchResponse:
        from knowledge_server.dispatch import run_dispatch, validate_dispatch

        valid = validate_dispatch(req)
        scope = effective_workspaces(current_call().principal, valid.workspaces)
        return await run_dispatch(self, valid, scope)

    async def get_episode(
        self, req: knowledge_service_pb2.GetEpisodeRequest
    ) -> knowledge_service_pb2.GetEpisodeResponse:
        lane = self.lanes.get("episodes")
        getter = getattr(lane, "get_episode_sync", None)
        if getter is None:
            raise Unimplemented("GetEpisode needs the built-in episodes lane")
        scope = effective_workspaces(current_call().principal, ())
        return await asyncio.to_thread(getter, req.id, req.neighbours, scope)

    async def get_chunk(
        self, req: knowledge_service_pb2.GetChunkRequest
    ) -> knowledge_service_pb2.GetChunkResponse:
        lane = self.lanes.get("code")
        getter = getattr(lane, "get_chunk_sync", None)
        if getter is None:
            raise Unimplemented("GetChunk needs the built-in code lane")
        scope = effective_workspaces(current_call().principal, ())
        return await asyncio.to_thread(getter, req.id, scope)

    # -- DocGraphService ---------------------------------------------------------------
    async def docgraph(self, op: str, req: object) -> object:
        from knowledge_server.lanes.common import in_thread

        lane = getattr(self, "docgraph_lane", None)
        op_sync = getattr(lane, "op_sync", None)
        if op_sync is None:
            raise Unimplemented(f"{op} (document graph) needs the built-in docgraph lane")
        scope = effective_workspaces(current_call().principal, ())
        return await in_thread(op_sync, op, req, scope, pool="docgraph")

    # -- IndexService ------------------------------------------------------------------
    async def index_stream(
        self, op: str, req: Any
    ) -> AsyncIterator[index_service_pb2.OperationSummary | index_service_pb2.Progress]:
        if op == "build_doc_graph":
            build = getattr(getattr(self, "docgraph_lane", None), "build_sync", None)
            if build is None:
                raise Unimplemented("BuildDocGraph needs the built-in docgraph lane")
            root = normalise_workspace(req.root) if req.root else None
            scope = effective_workspaces(current_call().principal, ())
            async for event in run_with_progress(
                lambda progress: build(
                    root,
                    req.estimate,
                    req.max_chunks,
                    req.budget_seconds,
                    req.structural_only,
                    progress,
                    scope,
                )
            ):
                yield event
            return
        if op == "ingest_sessions":
            lane = self.lanes.get("episodes")
            ingest = getattr(lane, "ingest_sync", None)
            if ingest is None:
                raise Unimplemented("IngestSessions needs the built-in episodes lane")
            paths = [normalise_workspace(p) for p in req.paths]
            for p in paths:
                if not os.path.exists(p):
                    raise InvalidRequest(
                        f"paths: {p} does not exist on the server", metadata={"field": "paths"}
                    )
            async for event in run_with_progress(lambda progress: ingest(paths or None, progress)):
                yield event
            await self.after_ingest()
            return
        if op == "index_workspace":
            lane = self.lanes.get("code")
            index = getattr(lane, "index_sync", None)
            if index is None:
                raise Unimplemented("IndexWorkspace needs the built-in code lane")
            if not req.root:
                raise InvalidRequest(
                    "root: an absolute workspace path is required", metadata={"field": "root"}
                )
            root = normalise_workspace(req.root)
            scope = effective_workspaces(current_call().principal, ())
            if scope is not None and not in_scope(root, scope):
                raise PermissionDenied("root: outside the workspaces this principal may manage")
            async for event in run_with_progress(lambda progress: index(root, req.full, progress)):
                yield event
            return
        if op == "rebuild_derived":
            lane = self.lanes.get("skills")
            episodes = self.lanes.get("episodes")
            rebuild = getattr(lane, "rebuild_sync", None)
            episodes_path = getattr(episodes, "path", None)
            if rebuild is None or episodes_path is None:
                raise Unimplemented("RebuildDerived needs the built-in skills and episodes lanes")
            async for event in run_with_progress(
                lambda progress: rebuild(episodes_path, req.full, progress)
            ):
                yield event
            return
        raise Unimplemented(f"{op} is declared in knowledge.v1 but not built in this server yet")

    async def after_ingest(self) -> None:
        """The derived layer is rebuilt incrementally after each ingestion."""
        async for _ in self.index_stream(
            "rebuild_derived", index_service_pb2.RebuildDerivedRequest()
        ):
            pass

    async def bootstrap(self) -> None:
        """Start-up work in the background: ingest logs (or the bundled sample), rebuild
        the derived layer, index the workspaces. Lanes answer KNOWLEDGE_INDEX_NOT_READY
        until their part is done; a failure is logged and kept for GetStatus."""
        log = get_logger("knowledge.bootstrap")
        if getattr(self.lanes.get("episodes"), "ingest_sync", None) is not None:
            try:
                async for event in self.index_stream(
                    "ingest_sessions", index_service_pb2.IngestSessionsRequest()
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
        if getattr(self.lanes.get("code"), "index_sync", None) is not None:
            for root in self.config.workspaces:
                try:
                    async for event in self.index_stream(
                        "index_workspace", index_service_pb2.IndexWorkspaceRequest(root=root)
                    ):
                        if isinstance(event, index_service_pb2.OperationSummary):
                            log.info(
                                "bootstrap.indexed",
                                workspace=root,
                                chunks=event.counters["chunks"],
                                index_rev=event.index_rev,
                                ms=event.ms,
                            )
                except Exception as exc:  # noqa: BLE001
                    log.error(
                        "bootstrap.index_failed", workspace=root, error_type=type(exc).__name__
                    )

    async def status(
        self, req: index_service_pb2.GetStatusRequest
    ) -> index_service_pb2.GetStatusResponse:
        principal = current_call().principal
        resp = index_service_pb2.GetStatusResponse(version=__version__)
        resp.edition.CopyFrom(self.licence.status())
        resp.principal.id = principal.id
        resp.principal.organisation = principal.organisation
        resp.principal.role = principal.role
        resp.principal.workspaces.extend(principal.workspaces or ())
        resp.started_at.FromDatetime(self.started_at)
        scope = effective_workspaces(principal, ())
        resp.workspaces.extend(w for w in self.config.workspaces if scope is None or w in scope)
        for name, lane in self.lanes.items():
            status = getattr(lane, "status", None)
            if status is not None:
                resp.lanes.append(status(scope))
            else:
                resp.lanes.append(
                    index_service_pb2.LaneStatus(
                        lane=name, degraded=True, capability="degraded", reason="not built"
                    )
                )
        if getattr(self, "docgraph_lane", None) is not None:
            resp.lanes.append(self.docgraph_lane.status(scope))
        return resp

    def close(self) -> None:
        for lane in [*self.lanes.values(), getattr(self, "docgraph_lane", None)]:
            closer = getattr(lane, "close", None)
            if closer is not None:
                closer()

    def data_path(self, name: str) -> Path:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        return self.config.data_dir / name
