"""Thin gRPC servicers: each RPC hands its request and the caller's principal to the
application layer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from knowledge_server._gen.knowledge.v1 import (
    dispatch_pb2,
    docgraph_pb2,
    docgraph_pb2_grpc,
    index_service_pb2,
    index_service_pb2_grpc,
    kb_admin_pb2,
    kb_admin_pb2_grpc,
    kb_retrieve_pb2,
    kb_retrieve_pb2_grpc,
    knowledge_service_pb2,
    knowledge_service_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    search_pb2,
)
from knowledge_server.app import KnowledgeApp
from knowledge_server.transport.interceptors import current_call

Context = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R", bound=Message)


class KnowledgeServicer(knowledge_service_pb2_grpc.KnowledgeServiceServicer):
    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    async def Search(
        self, request: search_pb2.SearchRequest, context: Context
    ) -> search_pb2.SearchResponse:
        return await self.app.search(request, current_call().principal)

    async def Dispatch(
        self, request: dispatch_pb2.DispatchRequest, context: Context
    ) -> dispatch_pb2.DispatchResponse:
        return await self.app.dispatch(request, current_call().principal)

    async def GetEpisode(
        self, request: knowledge_service_pb2.GetEpisodeRequest, context: Context
    ) -> knowledge_service_pb2.GetEpisodeResponse:
        return await self.app.get_episode(request, current_call().principal)

    async def GetChunk(
        self, request: knowledge_service_pb2.GetChunkRequest, context: Context
    ) -> knowledge_service_pb2.GetChunkResponse:
        return await self.app.get_chunk(request, current_call().principal)


class DocGraphServicer(docgraph_pb2_grpc.DocGraphServiceServicer):
    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    async def _op(self, op: str, request: Message, response: type[R]) -> R:
        return await self.app.docgraph(op, request, current_call().principal, response)

    async def Themes(
        self, request: docgraph_pb2.ThemesRequest, context: Context
    ) -> docgraph_pb2.ThemesResponse:
        return await self._op("themes", request, docgraph_pb2.ThemesResponse)

    async def EntityNeighbors(
        self, request: docgraph_pb2.EntityNeighborsRequest, context: Context
    ) -> docgraph_pb2.EntityNeighborsResponse:
        return await self._op("entity_neighbors", request, docgraph_pb2.EntityNeighborsResponse)

    async def DocRelations(
        self, request: docgraph_pb2.DocRelationsRequest, context: Context
    ) -> docgraph_pb2.DocRelationsResponse:
        return await self._op("doc_relations", request, docgraph_pb2.DocRelationsResponse)

    async def GlobalOverview(
        self, request: docgraph_pb2.GlobalOverviewRequest, context: Context
    ) -> docgraph_pb2.GlobalOverviewResponse:
        return await self._op("global_overview", request, docgraph_pb2.GlobalOverviewResponse)

    async def SearchLevels(
        self, request: docgraph_pb2.SearchLevelsRequest, context: Context
    ) -> docgraph_pb2.SearchLevelsResponse:
        return await self._op("search_levels", request, docgraph_pb2.SearchLevelsResponse)


class IndexServicer(index_service_pb2_grpc.IndexServiceServicer):
    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    async def _stream(
        self, op: str, request: Message, response: Callable[..., R]
    ) -> AsyncIterator[R]:
        """The app's progress events, then its summary, each wrapped in ``response``."""
        async for event in self.app.index_stream(op, request, current_call().principal):
            if isinstance(event, index_service_pb2.Progress):
                yield response(progress=event)
            else:
                yield response(summary=event)

    async def IndexWorkspace(
        self, request: index_service_pb2.IndexWorkspaceRequest, context: Context
    ) -> AsyncIterator[index_service_pb2.IndexWorkspaceResponse]:
        async for out in self._stream(
            "index_workspace", request, index_service_pb2.IndexWorkspaceResponse
        ):
            yield out

    async def IngestSessions(
        self, request: index_service_pb2.IngestSessionsRequest, context: Context
    ) -> AsyncIterator[index_service_pb2.IngestSessionsResponse]:
        async for out in self._stream(
            "ingest_sessions", request, index_service_pb2.IngestSessionsResponse
        ):
            yield out

    async def RebuildDerived(
        self, request: index_service_pb2.RebuildDerivedRequest, context: Context
    ) -> AsyncIterator[index_service_pb2.RebuildDerivedResponse]:
        async for out in self._stream(
            "rebuild_derived", request, index_service_pb2.RebuildDerivedResponse
        ):
            yield out

    async def BuildDocGraph(
        self, request: index_service_pb2.BuildDocGraphRequest, context: Context
    ) -> AsyncIterator[index_service_pb2.BuildDocGraphResponse]:
        async for out in self._stream(
            "build_doc_graph", request, index_service_pb2.BuildDocGraphResponse
        ):
            yield out

    async def GetStatus(
        self, request: index_service_pb2.GetStatusRequest, context: Context
    ) -> index_service_pb2.GetStatusResponse:
        return await self.app.status(request, current_call().principal)


def _kb(op: str) -> Callable[[KnowledgeBaseAdminServicer, Message, Context], Awaitable[Message]]:
    """The servicer method of the unary knowledge-base RPC ``op``."""

    async def method(
        self: KnowledgeBaseAdminServicer, request: Message, context: Context
    ) -> Message:
        return await self.app.kb_admin(op, request, current_call().principal)

    method.__name__ = op
    return method


class KnowledgeBaseAdminServicer(kb_admin_pb2_grpc.KnowledgeBaseAdminServiceServicer):
    """Every RPC hands over to ``KnowledgeApp.kb_admin`` (``kb/admin.py``)."""

    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    CreateTopic = _kb("CreateTopic")  # type: ignore[assignment]
    ListTopics = _kb("ListTopics")  # type: ignore[assignment]
    GetTopic = _kb("GetTopic")  # type: ignore[assignment]
    CreateRevision = _kb("CreateRevision")  # type: ignore[assignment]
    GetRevision = _kb("GetRevision")  # type: ignore[assignment]
    UpdateRevision = _kb("UpdateRevision")  # type: ignore[assignment]
    UploadSource = _kb("UploadSource")  # type: ignore[assignment]
    PutFaq = _kb("PutFaq")  # type: ignore[assignment]
    RemoveSource = _kb("RemoveSource")  # type: ignore[assignment]
    SubmitRevision = _kb("SubmitRevision")  # type: ignore[assignment]
    ApproveRevision = _kb("ApproveRevision")  # type: ignore[assignment]
    ReturnRevision = _kb("ReturnRevision")  # type: ignore[assignment]
    ProcessRevision = _kb("ProcessRevision")  # type: ignore[assignment]
    RetryTask = _kb("RetryTask")  # type: ignore[assignment]
    CancelTask = _kb("CancelTask")  # type: ignore[assignment]
    PublishRevision = _kb("PublishRevision")  # type: ignore[assignment]
    RollbackTopic = _kb("RollbackTopic")  # type: ignore[assignment]
    OfflineTopic = _kb("OfflineTopic")  # type: ignore[assignment]
    Reconcile = _kb("Reconcile")  # type: ignore[assignment]
    CreateTag = _kb("CreateTag")  # type: ignore[assignment]
    UpdateTag = _kb("UpdateTag")  # type: ignore[assignment]
    ListTags = _kb("ListTags")  # type: ignore[assignment]
    PutTemplate = _kb("PutTemplate")  # type: ignore[assignment]
    ListTemplates = _kb("ListTemplates")  # type: ignore[assignment]
    CreateFeedback = _kb("CreateFeedback")  # type: ignore[assignment]
    ListFeedback = _kb("ListFeedback")  # type: ignore[assignment]
    ResolveFeedback = _kb("ResolveFeedback")  # type: ignore[assignment]
    GetPolicy = _kb("GetPolicy")  # type: ignore[assignment]
    SetPolicy = _kb("SetPolicy")  # type: ignore[assignment]

    async def WatchTask(  # type: ignore[override]
        self, request: kb_admin_pb2.WatchTaskRequest, context: Context
    ) -> AsyncIterator[Message]:
        async for event in self.app.kb_watch(request, current_call().principal):
            yield event


def _trace_id(context: Context) -> str | None:
    """The caller's ``x-trace-id`` metadata (checked, or replaced, by the application)."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-trace-id" and isinstance(value, str):
            return value
    return None


class KnowledgeBaseServicer(kb_retrieve_pb2_grpc.KnowledgeBaseServiceServicer):
    """Retrieve and Answer (``kb/api.py``); the trace id goes back in ``x-trace-id``."""

    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    async def Retrieve(
        self, request: kb_retrieve_pb2.RetrieveRequest, context: Context
    ) -> kb_retrieve_pb2.RetrieveResponse:
        return await self.app.kb_retrieve(request, current_call().principal, _trace_id(context))

    async def Answer(
        self, request: kb_retrieve_pb2.AnswerRequest, context: Context
    ) -> kb_retrieve_pb2.AnswerResponse:
        return await self.app.kb_answer(request, current_call().principal, _trace_id(context))


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer):
    def __init__(self, app: KnowledgeApp) -> None:
        self.app = app

    async def _op(self, op: str, request: Message, response: type[R]) -> R:
        return await self.app.memory(op, request, current_call().principal, response)

    async def Remember(
        self, request: memory_pb2.RememberRequest, context: Context
    ) -> memory_pb2.RememberResponse:
        return await self._op("remember", request, memory_pb2.RememberResponse)

    async def Recall(
        self, request: memory_pb2.RecallRequest, context: Context
    ) -> memory_pb2.RecallResponse:
        return await self._op("recall", request, memory_pb2.RecallResponse)

    async def Timeline(
        self, request: memory_pb2.TimelineRequest, context: Context
    ) -> memory_pb2.TimelineResponse:
        return await self._op("timeline", request, memory_pb2.TimelineResponse)

    async def Rooms(
        self, request: memory_pb2.RoomsRequest, context: Context
    ) -> memory_pb2.RoomsResponse:
        return await self._op("rooms", request, memory_pb2.RoomsResponse)

    async def Relations(
        self, request: memory_pb2.RelationsRequest, context: Context
    ) -> memory_pb2.RelationsResponse:
        return await self._op("relations", request, memory_pb2.RelationsResponse)

    async def Policy(
        self, request: memory_pb2.PolicyRequest, context: Context
    ) -> memory_pb2.PolicyResponse:
        return await self._op("policy", request, memory_pb2.PolicyResponse)

    async def Consolidate(
        self, request: memory_pb2.ConsolidateRequest, context: Context
    ) -> memory_pb2.ConsolidateResponse:
        return await self._op("consolidate", request, memory_pb2.ConsolidateResponse)

    async def Restore(
        self, request: memory_pb2.RestoreRequest, context: Context
    ) -> memory_pb2.RestoreResponse:
        return await self._op("restore", request, memory_pb2.RestoreResponse)
