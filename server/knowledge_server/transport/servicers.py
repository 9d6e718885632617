"""Thin gRPC servicers: each RPC hands its request to the application layer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from knowledge_server._gen.knowledge.v1 import (
    docgraph_pb2_grpc,
    index_service_pb2,
    index_service_pb2_grpc,
    knowledge_service_pb2_grpc,
)
from knowledge_server.app import KnowledgeApp
from knowledge_server.transport.interceptors import current_call


class KnowledgeServicer(knowledge_service_pb2_grpc.KnowledgeServiceServicer):
    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    async def Search(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.search(request, current_call().principal)

    async def Dispatch(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.dispatch(request, current_call().principal)

    async def GetEpisode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.get_episode(request, current_call().principal)

    async def GetChunk(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.get_chunk(request, current_call().principal)


class DocGraphServicer(docgraph_pb2_grpc.DocGraphServiceServicer):
    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    async def Themes(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.docgraph("themes", request, current_call().principal)

    async def EntityNeighbors(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.docgraph("entity_neighbors", request, current_call().principal)

    async def DocRelations(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.docgraph("doc_relations", request, current_call().principal)

    async def GlobalOverview(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.docgraph("global_overview", request, current_call().principal)

    async def SearchLevels(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.docgraph("search_levels", request, current_call().principal)


def _stream(op: str, response_type: Any):  # type: ignore[no-untyped-def]
    async def method(
        self: IndexServicer, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for event in self.app.index_stream(op, request, current_call().principal):
            if isinstance(event, index_service_pb2.Progress):
                yield response_type(progress=event)
            else:
                yield response_type(summary=event)

    return method


class IndexServicer(index_service_pb2_grpc.IndexServiceServicer):
    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    IndexWorkspace = _stream("index_workspace", index_service_pb2.IndexWorkspaceResponse)
    IngestSessions = _stream("ingest_sessions", index_service_pb2.IngestSessionsResponse)
    RebuildDerived = _stream("rebuild_derived", index_service_pb2.RebuildDerivedResponse)
    BuildDocGraph = _stream("build_doc_graph", index_service_pb2.BuildDocGraphResponse)

    async def GetStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.app.status(request, current_call().principal)
