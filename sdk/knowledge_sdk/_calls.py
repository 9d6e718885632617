"""Every RPC of the service, written once for both clients.

``RPCS`` is the table of RPCs (path, request and response types, unary or
server-streaming, SDK method name). Each function below is one SDK method: its
parameters are the method's parameters, and it returns the call to make (a ``UnaryCall``
or a ``StreamCall``) without making it. ``client.py`` turns each into a method of the
sync client and of the async client, which only differ in how they send the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import betterproto2

from knowledge_sdk._gen.knowledge import v1

Req = TypeVar("Req", bound=betterproto2.Message)
Resp = TypeVar("Resp", bound=betterproto2.Message)


@dataclass(frozen=True)
class Rpc(Generic[Req, Resp]):
    """One RPC: its path, message types and shape."""

    service: str
    name: str
    request: type[Req]
    response: type[Resp]
    streaming: bool
    method: str

    @property
    def full_name(self) -> str:
        return f"{self.service}/{self.name}"

    @property
    def path(self) -> str:
        return f"/{self.full_name}"


_K = "knowledge.v1.KnowledgeService"
_D = "knowledge.v1.DocGraphService"
_I = "knowledge.v1.IndexService"
_A = "knowledge.v1.KnowledgeBaseAdminService"

SEARCH = Rpc(_K, "Search", v1.SearchRequest, v1.SearchResponse, False, "search")
DISPATCH = Rpc(_K, "Dispatch", v1.DispatchRequest, v1.DispatchResponse, False, "dispatch")
GET_EPISODE = Rpc(
    _K, "GetEpisode", v1.GetEpisodeRequest, v1.GetEpisodeResponse, False, "get_episode"
)
GET_CHUNK = Rpc(_K, "GetChunk", v1.GetChunkRequest, v1.GetChunkResponse, False, "get_chunk")
THEMES = Rpc(_D, "Themes", v1.ThemesRequest, v1.ThemesResponse, False, "themes")
ENTITY_NEIGHBORS = Rpc(
    _D,
    "EntityNeighbors",
    v1.EntityNeighborsRequest,
    v1.EntityNeighborsResponse,
    False,
    "entity_neighbors",
)
DOC_RELATIONS = Rpc(
    _D, "DocRelations", v1.DocRelationsRequest, v1.DocRelationsResponse, False, "doc_relations"
)
GLOBAL_OVERVIEW = Rpc(
    _D,
    "GlobalOverview",
    v1.GlobalOverviewRequest,
    v1.GlobalOverviewResponse,
    False,
    "global_overview",
)
SEARCH_LEVELS = Rpc(
    _D, "SearchLevels", v1.SearchLevelsRequest, v1.SearchLevelsResponse, False, "search_levels"
)
INDEX_WORKSPACE = Rpc(
    _I,
    "IndexWorkspace",
    v1.IndexWorkspaceRequest,
    v1.IndexWorkspaceResponse,
    True,
    "index_workspace",
)
INGEST_SESSIONS = Rpc(
    _I,
    "IngestSessions",
    v1.IngestSessionsRequest,
    v1.IngestSessionsResponse,
    True,
    "ingest_sessions",
)
REBUILD_DERIVED = Rpc(
    _I,
    "RebuildDerived",
    v1.RebuildDerivedRequest,
    v1.RebuildDerivedResponse,
    True,
    "rebuild_derived",
)
BUILD_DOC_GRAPH = Rpc(
    _I,
    "BuildDocGraph",
    v1.BuildDocGraphRequest,
    v1.BuildDocGraphResponse,
    True,
    "build_doc_graph",
)
GET_STATUS = Rpc(_I, "GetStatus", v1.GetStatusRequest, v1.GetStatusResponse, False, "get_status")
KB_CREATE_TOPIC = Rpc(
    _A, "CreateTopic", v1.CreateTopicRequest, v1.CreateTopicResponse, False, "kb_create_topic"
)
KB_LIST_TOPICS = Rpc(
    _A, "ListTopics", v1.ListTopicsRequest, v1.ListTopicsResponse, False, "kb_list_topics"
)
KB_GET_TOPIC = Rpc(_A, "GetTopic", v1.GetTopicRequest, v1.GetTopicResponse, False, "kb_get_topic")
KB_CREATE_REVISION = Rpc(
    _A,
    "CreateRevision",
    v1.CreateRevisionRequest,
    v1.CreateRevisionResponse,
    False,
    "kb_create_revision",
)
KB_GET_REVISION = Rpc(
    _A, "GetRevision", v1.GetRevisionRequest, v1.GetRevisionResponse, False, "kb_get_revision"
)
KB_UPDATE_REVISION = Rpc(
    _A,
    "UpdateRevision",
    v1.UpdateRevisionRequest,
    v1.UpdateRevisionResponse,
    False,
    "kb_update_revision",
)
KB_UPLOAD_SOURCE = Rpc(
    _A,
    "UploadSource",
    v1.UploadSourceRequest,
    v1.UploadSourceResponse,
    False,
    "kb_upload_source_piece",
)
KB_PUT_FAQ = Rpc(_A, "PutFaq", v1.PutFaqRequest, v1.PutFaqResponse, False, "kb_put_faq")
KB_REMOVE_SOURCE = Rpc(
    _A, "RemoveSource", v1.RemoveSourceRequest, v1.RemoveSourceResponse, False, "kb_remove_source"
)
KB_SUBMIT_REVISION = Rpc(
    _A, "SubmitRevision", v1.SubmitRevisionRequest, v1.SubmitRevisionResponse, False, "kb_submit"
)
KB_APPROVE_REVISION = Rpc(
    _A,
    "ApproveRevision",
    v1.ApproveRevisionRequest,
    v1.ApproveRevisionResponse,
    False,
    "kb_approve",
)
KB_RETURN_REVISION = Rpc(
    _A, "ReturnRevision", v1.ReturnRevisionRequest, v1.ReturnRevisionResponse, False, "kb_return"
)
KB_PROCESS_REVISION = Rpc(
    _A,
    "ProcessRevision",
    v1.ProcessRevisionRequest,
    v1.ProcessRevisionResponse,
    False,
    "kb_process",
)
KB_RETRY_TASK = Rpc(
    _A, "RetryTask", v1.RetryTaskRequest, v1.RetryTaskResponse, False, "kb_retry_task"
)
KB_CANCEL_TASK = Rpc(
    _A, "CancelTask", v1.CancelTaskRequest, v1.CancelTaskResponse, False, "kb_cancel_task"
)
KB_WATCH_TASK = Rpc(
    _A, "WatchTask", v1.WatchTaskRequest, v1.WatchTaskResponse, True, "kb_watch_task"
)
KB_PUBLISH_REVISION = Rpc(
    _A,
    "PublishRevision",
    v1.PublishRevisionRequest,
    v1.PublishRevisionResponse,
    False,
    "kb_publish",
)
KB_ROLLBACK_TOPIC = Rpc(
    _A, "RollbackTopic", v1.RollbackTopicRequest, v1.RollbackTopicResponse, False, "kb_rollback"
)
KB_OFFLINE_TOPIC = Rpc(
    _A, "OfflineTopic", v1.OfflineTopicRequest, v1.OfflineTopicResponse, False, "kb_offline"
)
KB_RECONCILE = Rpc(
    _A, "Reconcile", v1.ReconcileRequest, v1.ReconcileResponse, False, "kb_reconcile"
)
KB_CREATE_TAG = Rpc(
    _A, "CreateTag", v1.CreateTagRequest, v1.CreateTagResponse, False, "kb_create_tag"
)
KB_UPDATE_TAG = Rpc(
    _A, "UpdateTag", v1.UpdateTagRequest, v1.UpdateTagResponse, False, "kb_update_tag"
)
KB_LIST_TAGS = Rpc(_A, "ListTags", v1.ListTagsRequest, v1.ListTagsResponse, False, "kb_list_tags")
KB_PUT_TEMPLATE = Rpc(
    _A, "PutTemplate", v1.PutTemplateRequest, v1.PutTemplateResponse, False, "kb_put_template"
)
KB_LIST_TEMPLATES = Rpc(
    _A,
    "ListTemplates",
    v1.ListTemplatesRequest,
    v1.ListTemplatesResponse,
    False,
    "kb_list_templates",
)
KB_CREATE_FEEDBACK = Rpc(
    _A,
    "CreateFeedback",
    v1.CreateFeedbackRequest,
    v1.CreateFeedbackResponse,
    False,
    "kb_create_feedback",
)
KB_LIST_FEEDBACK = Rpc(
    _A, "ListFeedback", v1.ListFeedbackRequest, v1.ListFeedbackResponse, False, "kb_list_feedback"
)
KB_RESOLVE_FEEDBACK = Rpc(
    _A,
    "ResolveFeedback",
    v1.ResolveFeedbackRequest,
    v1.ResolveFeedbackResponse,
    False,
    "kb_resolve_feedback",
)
KB_GET_POLICY = Rpc(
    _A, "GetPolicy", v1.GetPolicyRequest, v1.GetPolicyResponse, False, "kb_get_policy"
)
KB_SET_POLICY = Rpc(
    _A, "SetPolicy", v1.SetPolicyRequest, v1.SetPolicyResponse, False, "kb_set_policy"
)
_R = "knowledge.v1.KnowledgeBaseService"
KB_RETRIEVE = Rpc(_R, "Retrieve", v1.RetrieveRequest, v1.RetrieveResponse, False, "kb_retrieve")
KB_ANSWER = Rpc(_R, "Answer", v1.AnswerRequest, v1.AnswerResponse, False, "kb_answer")
_M = "knowledge.v1.MemoryService"
REMEMBER = Rpc(_M, "Remember", v1.RememberRequest, v1.RememberResponse, False, "remember")
RECALL = Rpc(_M, "Recall", v1.RecallRequest, v1.RecallResponse, False, "recall")
TIMELINE = Rpc(_M, "Timeline", v1.TimelineRequest, v1.TimelineResponse, False, "timeline")
ROOMS = Rpc(_M, "Rooms", v1.RoomsRequest, v1.RoomsResponse, False, "rooms")
RELATIONS = Rpc(_M, "Relations", v1.RelationsRequest, v1.RelationsResponse, False, "relations")
MEMORY_POLICY = Rpc(_M, "Policy", v1.PolicyRequest, v1.PolicyResponse, False, "memory_policy")
CONSOLIDATE = Rpc(
    _M, "Consolidate", v1.ConsolidateRequest, v1.ConsolidateResponse, False, "consolidate"
)
RESTORE = Rpc(_M, "Restore", v1.RestoreRequest, v1.RestoreResponse, False, "restore")

RPCS: tuple[Rpc[Any, Any], ...] = (
    SEARCH,
    DISPATCH,
    GET_EPISODE,
    GET_CHUNK,
    THEMES,
    ENTITY_NEIGHBORS,
    DOC_RELATIONS,
    GLOBAL_OVERVIEW,
    SEARCH_LEVELS,
    INDEX_WORKSPACE,
    INGEST_SESSIONS,
    REBUILD_DERIVED,
    BUILD_DOC_GRAPH,
    GET_STATUS,
    KB_CREATE_TOPIC,
    KB_LIST_TOPICS,
    KB_GET_TOPIC,
    KB_CREATE_REVISION,
    KB_GET_REVISION,
    KB_UPDATE_REVISION,
    KB_UPLOAD_SOURCE,
    KB_PUT_FAQ,
    KB_REMOVE_SOURCE,
    KB_SUBMIT_REVISION,
    KB_APPROVE_REVISION,
    KB_RETURN_REVISION,
    KB_PROCESS_REVISION,
    KB_RETRY_TASK,
    KB_CANCEL_TASK,
    KB_WATCH_TASK,
    KB_PUBLISH_REVISION,
    KB_ROLLBACK_TOPIC,
    KB_OFFLINE_TOPIC,
    KB_RECONCILE,
    KB_CREATE_TAG,
    KB_UPDATE_TAG,
    KB_LIST_TAGS,
    KB_PUT_TEMPLATE,
    KB_LIST_TEMPLATES,
    KB_CREATE_FEEDBACK,
    KB_LIST_FEEDBACK,
    KB_RESOLVE_FEEDBACK,
    KB_GET_POLICY,
    KB_SET_POLICY,
    KB_RETRIEVE,
    KB_ANSWER,
    REMEMBER,
    RECALL,
    TIMELINE,
    ROOMS,
    RELATIONS,
    MEMORY_POLICY,
    CONSOLIDATE,
    RESTORE,
)


@dataclass(frozen=True)
class UnaryCall(Generic[Resp]):
    """A unary call to make. ``timeout`` None means the client's default deadline."""

    rpc: Rpc[Any, Resp]
    request: betterproto2.Message
    timeout: float | None
    request_id: str = ""
    # Sent as ``x-trace-id`` (Retrieve, Answer): the service answers with it.
    trace_id: str = ""


@dataclass(frozen=True)
class StreamCall(Generic[Resp]):
    """A server-streaming call to make. ``timeout`` None means no deadline: index
    builds stream progress for as long as they take."""

    rpc: Rpc[Any, Resp]
    request: betterproto2.Message
    timeout: float | None


def _utc(when: datetime | None) -> datetime | None:
    """A datetime without a time zone is UTC, as the service takes it (protobuf's
    Timestamp needs an aware one)."""
    return when if when is None or when.tzinfo else when.replace(tzinfo=UTC)


def search_request(
    query: str,
    *,
    mode: str = "auto",
    include: Sequence[str] | None = None,
    limit: int = 10,
    workspaces: Sequence[str] = (),
    session_ids: Sequence[str] = (),
    actor_ids: Sequence[str] = (),
    skills: Sequence[str] = (),
    paths: Sequence[str] = (),
    outcome: str = "any",
    since: datetime | None = None,
    until: datetime | None = None,
    max_tokens: int = 4000,
    snippet_chars: int = 240,
    provenance: str = "strict",
    trace: bool = False,
    request_id: str = "",
) -> v1.SearchRequest:
    """Build a ``knowledge.search/v1`` request with the seed's defaults.

    ``since``/``until`` keep episodes whose event time lies in that window (inclusive; a
    datetime without a time zone is taken as UTC, as the service takes it)."""
    return v1.SearchRequest(
        schema="knowledge.search/v1",
        request_id=request_id,
        query=query,
        mode=mode,
        filters=v1.SearchFilters(
            workspaces=list(workspaces),
            session_ids=list(session_ids),
            actor_ids=list(actor_ids),
            skills=list(skills),
            paths=list(paths),
            outcome=outcome,
            since=_utc(since),
            until=_utc(until),
        ),
        include=list(include) if include is not None else ["episodes", "code", "skills"],
        limit=limit,
        budget=v1.SearchBudget(max_tokens=max_tokens, snippet_chars=snippet_chars),
        provenance=provenance,
        trace=trace,
    )


def dispatch_request(
    task: str,
    *,
    acceptance: Sequence[str] = (),
    constraints: Sequence[str] = (),
    target: str = "auto",
    actor_id: str = "",
    commit: bool = False,
    workspaces: Sequence[str] = (),
    request_id: str = "",
) -> v1.DispatchRequest:
    """Build a ``knowledge.dispatch/v1`` request; a dry run unless ``commit=True``."""
    return v1.DispatchRequest(
        schema="knowledge.dispatch/v1",
        task=v1.DispatchTask(text=task, acceptance=list(acceptance), constraints=list(constraints)),
        target=target,
        actor_id=actor_id,
        dry_run=not commit,
        workspaces=list(workspaces),
        request_id=request_id,
    )


# KnowledgeService


def search(
    query: str | v1.SearchRequest,
    *,
    mode: str = "auto",
    include: Sequence[str] | None = None,
    limit: int = 10,
    workspaces: Sequence[str] = (),
    session_ids: Sequence[str] = (),
    actor_ids: Sequence[str] = (),
    skills: Sequence[str] = (),
    paths: Sequence[str] = (),
    outcome: str = "any",
    since: datetime | None = None,
    until: datetime | None = None,
    max_tokens: int = 4000,
    snippet_chars: int = 240,
    provenance: str = "strict",
    trace: bool = False,
    request_id: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.SearchResponse]:
    """Search the lanes (``knowledge.search/v1``). ``query`` is the question, or a whole
    ``SearchRequest`` (then the other request parameters are not used); the parameters
    are those of ``search_request``.

    Every lane of the answer says why it is empty in ``empty_reason`` (``""`` when it has
    items): ``"no_match"``, ``"index_empty"``, ``"not_indexed"`` (nothing indexed in the
    caller's workspaces), ``"not_requested"`` (left out of ``include``; not degraded),
    ``"unavailable"`` (the lane failed or timed out; ``errors`` names the cause with the
    lane and a reason code) or ``"budget"`` (``limits.dropped`` lists what went)."""
    request = (
        query
        if isinstance(query, v1.SearchRequest)
        else search_request(
            query,
            mode=mode,
            include=include,
            limit=limit,
            workspaces=workspaces,
            session_ids=session_ids,
            actor_ids=actor_ids,
            skills=skills,
            paths=paths,
            outcome=outcome,
            since=since,
            until=until,
            max_tokens=max_tokens,
            snippet_chars=snippet_chars,
            provenance=provenance,
            trace=trace,
            request_id=request_id,
        )
    )
    return UnaryCall(SEARCH, request, timeout, request.request_id)


def dispatch(
    task: str | v1.DispatchRequest,
    *,
    acceptance: Sequence[str] = (),
    constraints: Sequence[str] = (),
    target: str = "auto",
    actor_id: str = "",
    commit: bool = False,
    workspaces: Sequence[str] = (),
    request_id: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.DispatchResponse]:
    """Plan a hand-off (``knowledge.dispatch/v1``); a dry run unless ``commit=True``.
    ``task`` is the task text, or a whole ``DispatchRequest`` (then the other request
    parameters are not used)."""
    request = (
        task
        if isinstance(task, v1.DispatchRequest)
        else dispatch_request(
            task,
            acceptance=acceptance,
            constraints=constraints,
            target=target,
            actor_id=actor_id,
            commit=commit,
            workspaces=workspaces,
            request_id=request_id,
        )
    )
    return UnaryCall(DISPATCH, request, timeout, request.request_id)


def get_episode(
    id: str, *, neighbours: int = 0, timeout: float | None = None
) -> UnaryCall[v1.GetEpisodeResponse]:
    """One episode by id, with ``neighbours`` events on each side."""
    return UnaryCall(GET_EPISODE, v1.GetEpisodeRequest(id=id, neighbours=neighbours), timeout)


def get_chunk(id: str, *, timeout: float | None = None) -> UnaryCall[v1.GetChunkResponse]:
    """One code chunk by id."""
    return UnaryCall(GET_CHUNK, v1.GetChunkRequest(id=id), timeout)


# DocGraphService


def themes(
    *, scope: str = "", limit: int = 10, timeout: float | None = None
) -> UnaryCall[v1.ThemesResponse]:
    """Themes of the document graph."""
    return UnaryCall(THEMES, v1.ThemesRequest(scope=scope, limit=limit), timeout)


def entity_neighbors(
    entity: str,
    *,
    depth: int = 1,
    kind: str = "entity",
    limit: int = 25,
    timeout: float | None = None,
) -> UnaryCall[v1.EntityNeighborsResponse]:
    """Neighbours of an entity (or theme) in the document graph."""
    request = v1.EntityNeighborsRequest(entity=entity, depth=depth, kind=kind, limit=limit)
    return UnaryCall(ENTITY_NEIGHBORS, request, timeout)


def doc_relations(
    *, doc: str = "", entity: str = "", limit: int = 25, timeout: float | None = None
) -> UnaryCall[v1.DocRelationsResponse]:
    """Relations between documents through shared entities."""
    request = v1.DocRelationsRequest(doc=doc, entity=entity, limit=limit)
    return UnaryCall(DOC_RELATIONS, request, timeout)


def global_overview(
    *, limit: int = 10, timeout: float | None = None
) -> UnaryCall[v1.GlobalOverviewResponse]:
    """A map of the document corpus."""
    return UnaryCall(GLOBAL_OVERVIEW, v1.GlobalOverviewRequest(limit=limit), timeout)


def search_levels(
    query: str, *, limit: int = 10, timeout: float | None = None
) -> UnaryCall[v1.SearchLevelsResponse]:
    """Theme-level and entity-level search of the document graph."""
    return UnaryCall(SEARCH_LEVELS, v1.SearchLevelsRequest(query=query, limit=limit), timeout)


# IndexService


def index_workspace(
    root: str, *, full: bool = False, timeout: float | None = None
) -> StreamCall[v1.IndexWorkspaceResponse]:
    """Index a workspace; streams progress."""
    return StreamCall(INDEX_WORKSPACE, v1.IndexWorkspaceRequest(root=root, full=full), timeout)


def ingest_sessions(
    paths: Sequence[str] = (), *, timeout: float | None = None
) -> StreamCall[v1.IngestSessionsResponse]:
    """Ingest session logs; streams progress."""
    return StreamCall(INGEST_SESSIONS, v1.IngestSessionsRequest(paths=list(paths)), timeout)


def rebuild_derived(
    *, full: bool = False, timeout: float | None = None
) -> StreamCall[v1.RebuildDerivedResponse]:
    """Rebuild the derived layer; streams progress."""
    return StreamCall(REBUILD_DERIVED, v1.RebuildDerivedRequest(full=full), timeout)


def build_doc_graph(
    request: v1.BuildDocGraphRequest | None = None, *, timeout: float | None = None
) -> StreamCall[v1.BuildDocGraphResponse]:
    """Build the document graph; streams progress."""
    return StreamCall(BUILD_DOC_GRAPH, request or v1.BuildDocGraphRequest(), timeout)


def get_status(*, timeout: float | None = None) -> UnaryCall[v1.GetStatusResponse]:
    """Edition, licence and the state of every lane."""
    return UnaryCall(GET_STATUS, v1.GetStatusRequest(), timeout)


# KnowledgeBaseAdminService (management: not for agents' tokens)


def kb_create_topic(
    knowledge_key: str, title: str, *, timeout: float | None = None
) -> UnaryCall[v1.CreateTopicResponse]:
    """Create a knowledge topic (``knowledge_key`` unique in the caller's organisation)."""
    return UnaryCall(
        KB_CREATE_TOPIC, v1.CreateTopicRequest(knowledge_key=knowledge_key, title=title), timeout
    )


def kb_list_topics(
    *, after: str = "", limit: int = 100, timeout: float | None = None
) -> UnaryCall[v1.ListTopicsResponse]:
    """Topics of the caller's organisation by ``knowledge_key`` (page with ``after``)."""
    return UnaryCall(KB_LIST_TOPICS, v1.ListTopicsRequest(after=after, limit=limit), timeout)


def kb_get_topic(topic_id: str, *, timeout: float | None = None) -> UnaryCall[v1.GetTopicResponse]:
    """A topic with its revisions and release history."""
    return UnaryCall(KB_GET_TOPIC, v1.GetTopicRequest(topic_id=topic_id), timeout)


def kb_create_revision(
    topic_id: str, version_label: str, *, based_on: str = "", timeout: float | None = None
) -> UnaryCall[v1.CreateRevisionResponse]:
    """A new DRAFT of a topic, copying ``based_on``'s sources and tags when given."""
    return UnaryCall(
        KB_CREATE_REVISION,
        v1.CreateRevisionRequest(topic_id=topic_id, version_label=version_label, based_on=based_on),
        timeout,
    )


def kb_get_revision(
    revision_id: str, *, timeout: float | None = None
) -> UnaryCall[v1.GetRevisionResponse]:
    """A revision with its sources and tasks."""
    return UnaryCall(KB_GET_REVISION, v1.GetRevisionRequest(revision_id=revision_id), timeout)


def kb_update_revision(
    revision_id: str,
    expected_version: int,
    *,
    version_label: str | None = None,
    tags: Sequence[str] | None = None,
    timeout: float | None = None,
) -> UnaryCall[v1.UpdateRevisionResponse]:
    """Change a DRAFT's label or (with ``tags``) replace its tag codes."""
    return UnaryCall(
        KB_UPDATE_REVISION,
        v1.UpdateRevisionRequest(
            revision_id=revision_id,
            expected_version=expected_version,
            version_label=version_label,
            replace_tags=tags is not None,
            tags=list(tags or ()),
        ),
        timeout,
    )


def kb_upload_source_piece(
    revision_id: str,
    *,
    upload_id: str = "",
    file_name: str = "",
    media_type: str = "",
    offset: int = 0,
    data: bytes = b"",
    final: bool = False,
    expected_version: int = 0,
    timeout: float | None = None,
) -> UnaryCall[v1.UploadSourceResponse]:
    """One piece (at most 1 MiB) of a source file upload; ``knowledge_sdk.upload_file`` sends a whole file."""
    return UnaryCall(
        KB_UPLOAD_SOURCE,
        v1.UploadSourceRequest(
            revision_id=revision_id,
            upload_id=upload_id,
            file_name=file_name,
            media_type=media_type,
            offset=offset,
            data=data,
            final=final,
            expected_version=expected_version,
        ),
        timeout,
    )


def kb_put_faq(
    revision_id: str,
    expected_version: int,
    question: str,
    answer: str,
    *,
    source_id: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.PutFaqResponse]:
    """Add an FAQ entry to a DRAFT, or replace ``source_id``."""
    return UnaryCall(
        KB_PUT_FAQ,
        v1.PutFaqRequest(
            revision_id=revision_id,
            expected_version=expected_version,
            question=question,
            answer=answer,
            source_id=source_id,
        ),
        timeout,
    )


def kb_remove_source(
    revision_id: str, expected_version: int, source_id: str, *, timeout: float | None = None
) -> UnaryCall[v1.RemoveSourceResponse]:
    """Remove a source from a DRAFT."""
    return UnaryCall(
        KB_REMOVE_SOURCE,
        v1.RemoveSourceRequest(
            revision_id=revision_id, expected_version=expected_version, source_id=source_id
        ),
        timeout,
    )


def kb_submit(
    revision_id: str, expected_version: int, *, timeout: float | None = None
) -> UnaryCall[v1.SubmitRevisionResponse]:
    """Submit a DRAFT for review."""
    return UnaryCall(
        KB_SUBMIT_REVISION,
        v1.SubmitRevisionRequest(revision_id=revision_id, expected_version=expected_version),
        timeout,
    )


def kb_approve(
    revision_id: str, expected_version: int, *, timeout: float | None = None
) -> UnaryCall[v1.ApproveRevisionResponse]:
    """Approve a revision under review (four-eyes)."""
    return UnaryCall(
        KB_APPROVE_REVISION,
        v1.ApproveRevisionRequest(revision_id=revision_id, expected_version=expected_version),
        timeout,
    )


def kb_return(
    revision_id: str, expected_version: int, reason: str, *, timeout: float | None = None
) -> UnaryCall[v1.ReturnRevisionResponse]:
    """Return a revision under review to DRAFT with a reason."""
    return UnaryCall(
        KB_RETURN_REVISION,
        v1.ReturnRevisionRequest(
            revision_id=revision_id, expected_version=expected_version, reason=reason
        ),
        timeout,
    )


def kb_process(
    revision_id: str,
    expected_version: int,
    *,
    idempotency_key: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.ProcessRevisionResponse]:
    """Queue PROCESS for an APPROVED revision (the same key twice queues one task)."""
    return UnaryCall(
        KB_PROCESS_REVISION,
        v1.ProcessRevisionRequest(
            revision_id=revision_id,
            expected_version=expected_version,
            idempotency_key=idempotency_key,
        ),
        timeout,
    )


def kb_retry_task(
    task_id: str, expected_version: int, *, timeout: float | None = None
) -> UnaryCall[v1.RetryTaskResponse]:
    """Queue a FAILED task again."""
    return UnaryCall(
        KB_RETRY_TASK,
        v1.RetryTaskRequest(task_id=task_id, expected_version=expected_version),
        timeout,
    )


def kb_cancel_task(
    task_id: str, expected_version: int, *, timeout: float | None = None
) -> UnaryCall[v1.CancelTaskResponse]:
    """Cancel a task not started yet."""
    return UnaryCall(
        KB_CANCEL_TASK,
        v1.CancelTaskRequest(task_id=task_id, expected_version=expected_version),
        timeout,
    )


def kb_watch_task(
    task_id: str, *, timeout: float | None = None
) -> StreamCall[v1.WatchTaskResponse]:
    """A task's progress, each time it changes, until it ends."""
    return StreamCall(KB_WATCH_TASK, v1.WatchTaskRequest(task_id=task_id), timeout)


def kb_publish(
    revision_id: str,
    expected_version: int,
    *,
    expected_release: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.PublishRevisionResponse]:
    """Publish a PROCESSED revision, naming the topic's current release ("" = none)."""
    return UnaryCall(
        KB_PUBLISH_REVISION,
        v1.PublishRevisionRequest(
            revision_id=revision_id,
            expected_version=expected_version,
            expected_release=expected_release,
        ),
        timeout,
    )


def kb_rollback(
    topic_id: str, expected_release: str, *, timeout: float | None = None
) -> UnaryCall[v1.RollbackTopicResponse]:
    """Restore the release the current one replaced."""
    return UnaryCall(
        KB_ROLLBACK_TOPIC,
        v1.RollbackTopicRequest(topic_id=topic_id, expected_release=expected_release),
        timeout,
    )


def kb_offline(
    topic_id: str, expected_release: str, *, timeout: float | None = None
) -> UnaryCall[v1.OfflineTopicResponse]:
    """Take the topic's release offline."""
    return UnaryCall(
        KB_OFFLINE_TOPIC,
        v1.OfflineTopicRequest(topic_id=topic_id, expected_release=expected_release),
        timeout,
    )


def kb_reconcile(*, timeout: float | None = None) -> UnaryCall[v1.ReconcileResponse]:
    """Compare the metadata with the retrieval index and repair the drift."""
    return UnaryCall(KB_RECONCILE, v1.ReconcileRequest(), timeout)


def kb_create_tag(
    tag_code: str, display_name: str, *, sort_order: int = 0, timeout: float | None = None
) -> UnaryCall[v1.CreateTagResponse]:
    """Add a tag (its code is frozen)."""
    return UnaryCall(
        KB_CREATE_TAG,
        v1.CreateTagRequest(tag_code=tag_code, display_name=display_name, sort_order=sort_order),
        timeout,
    )


def kb_update_tag(
    tag_code: str,
    expected_version: int,
    *,
    display_name: str | None = None,
    sort_order: int | None = None,
    active: bool | None = None,
    timeout: float | None = None,
) -> UnaryCall[v1.UpdateTagResponse]:
    """Rename, reorder, (de)activate a tag."""
    return UnaryCall(
        KB_UPDATE_TAG,
        v1.UpdateTagRequest(
            tag_code=tag_code,
            expected_version=expected_version,
            display_name=display_name,
            sort_order=sort_order,
            active=active,
        ),
        timeout,
    )


def kb_list_tags(
    *, include_inactive: bool = False, timeout: float | None = None
) -> UnaryCall[v1.ListTagsResponse]:
    """The tag dictionary."""
    return UnaryCall(KB_LIST_TAGS, v1.ListTagsRequest(include_inactive=include_inactive), timeout)


def kb_put_template(
    template_code: str,
    body: str,
    *,
    status: str = "ACTIVE",
    expected_version: int = 0,
    timeout: float | None = None,
) -> UnaryCall[v1.PutTemplateResponse]:
    """Create (``expected_version`` 0) or change an answer template."""
    return UnaryCall(
        KB_PUT_TEMPLATE,
        v1.PutTemplateRequest(
            template_code=template_code, body=body, status=status, expected_version=expected_version
        ),
        timeout,
    )


def kb_list_templates(*, timeout: float | None = None) -> UnaryCall[v1.ListTemplatesResponse]:
    """The answer templates."""
    return UnaryCall(KB_LIST_TEMPLATES, v1.ListTemplatesRequest(), timeout)


def kb_create_feedback(
    topic_id: str, body: str, *, revision_id: str = "", timeout: float | None = None
) -> UnaryCall[v1.CreateFeedbackResponse]:
    """Record feedback on a topic."""
    return UnaryCall(
        KB_CREATE_FEEDBACK,
        v1.CreateFeedbackRequest(topic_id=topic_id, body=body, revision_id=revision_id),
        timeout,
    )


def kb_list_feedback(
    *, status: str = "", limit: int = 100, timeout: float | None = None
) -> UnaryCall[v1.ListFeedbackResponse]:
    """Feedback items, newest first."""
    return UnaryCall(KB_LIST_FEEDBACK, v1.ListFeedbackRequest(status=status, limit=limit), timeout)


def kb_resolve_feedback(
    feedback_id: str,
    expected_version: int,
    *,
    create_draft: bool = False,
    version_label: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.ResolveFeedbackResponse]:
    """Close a feedback item, optionally as a new DRAFT."""
    return UnaryCall(
        KB_RESOLVE_FEEDBACK,
        v1.ResolveFeedbackRequest(
            feedback_id=feedback_id,
            expected_version=expected_version,
            create_draft=create_draft,
            version_label=version_label,
        ),
        timeout,
    )


def kb_get_policy(*, timeout: float | None = None) -> UnaryCall[v1.GetPolicyResponse]:
    """The organisation's knowledge-base policy."""
    return UnaryCall(KB_GET_POLICY, v1.GetPolicyRequest(), timeout)


def kb_set_policy(
    allow_self_approval: bool, expected_version: int, *, timeout: float | None = None
) -> UnaryCall[v1.SetPolicyResponse]:
    """Change the knowledge-base policy."""
    return UnaryCall(
        KB_SET_POLICY,
        v1.SetPolicyRequest(
            allow_self_approval=allow_self_approval, expected_version=expected_version
        ),
        timeout,
    )


# KnowledgeBaseService (agents: published knowledge only)


def kb_retrieve(
    query: str,
    *,
    all_tag_codes: Sequence[str] = (),
    any_tag_codes: Sequence[str] = (),
    top_k: int = 0,
    trace_id: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.RetrieveResponse]:
    """Citable published evidence for ``query`` in the caller's organisation: sources
    carry every tag of ``all_tag_codes`` and one of ``any_tag_codes``; ``top_k`` 0 = the
    service's default. ``answerable`` False with ``reason_code`` ``NO_EVIDENCE`` is an
    answer; a failing dependency raises ``Unavailable`` (``KNOWLEDGE_DEPENDENCY_UNAVAILABLE``,
    the trace id in its metadata). ``trace_id`` (optional) is sent as ``x-trace-id``."""
    request = v1.RetrieveRequest(
        query=query,
        all_tag_codes=list(all_tag_codes),
        any_tag_codes=list(any_tag_codes),
        top_k=top_k,
    )
    return UnaryCall(KB_RETRIEVE, request, timeout, trace_id=trace_id)


def kb_answer(
    query: str,
    *,
    all_tag_codes: Sequence[str] = (),
    any_tag_codes: Sequence[str] = (),
    top_k: int = 0,
    template_code: str = "",
    trace_id: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.AnswerResponse]:
    """An answer from the service's chat model over the reranked published evidence,
    with the organisation's template ``template_code`` (empty: DEFAULT). Without evidence
    the model is not called and the configured no-evidence reply comes back."""
    request = v1.AnswerRequest(
        query=query,
        all_tag_codes=list(all_tag_codes),
        any_tag_codes=list(any_tag_codes),
        top_k=top_k,
        template_code=template_code,
    )
    return UnaryCall(KB_ANSWER, request, timeout, trace_id=trace_id)


# MemoryService


def remember(
    category: str,
    key: str,
    value: str,
    *,
    store: str = "facts",
    confidence: float = 0.0,
    workspace: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.RememberResponse]:
    """Write one value to the memory of ``workspace`` (empty: the token's only one).
    For ``store="relations"``: ``category`` is the relation kind, ``key`` the source and
    ``value`` the target. ``confidence`` 0 means the service's default (0.7)."""
    request = v1.RememberRequest(
        workspace=workspace,
        store=store,
        category=category,
        key=key,
        value=value,
        confidence=confidence,
    )
    return UnaryCall(REMEMBER, request, timeout)


def recall(
    query: str = "",
    *,
    store: str = "facts",
    category: str = "",
    limit: int = 0,
    workspace: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.RecallResponse]:
    """Current entries matching ``query``; ``truncation`` says what the budget cut."""
    request = v1.RecallRequest(
        workspace=workspace, store=store, query=query, category=category, limit=limit
    )
    return UnaryCall(RECALL, request, timeout)


def timeline(
    category: str,
    key: str,
    *,
    store: str = "facts",
    limit: int = 0,
    workspace: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.TimelineResponse]:
    """Every version of one key, oldest first."""
    request = v1.TimelineRequest(
        workspace=workspace, store=store, category=category, key=key, limit=limit
    )
    return UnaryCall(TIMELINE, request, timeout)


def rooms(
    *, store: str = "facts", limit: int = 0, workspace: str = "", timeout: float | None = None
) -> UnaryCall[v1.RoomsResponse]:
    """Categories of a store with their number of current entries."""
    return UnaryCall(ROOMS, v1.RoomsRequest(workspace=workspace, store=store, limit=limit), timeout)


def relations(
    ref: str = "", *, limit: int = 0, workspace: str = "", timeout: float | None = None
) -> UnaryCall[v1.RelationsResponse]:
    """Relation edges from or to ``ref`` (every edge when empty)."""
    request = v1.RelationsRequest(workspace=workspace, ref=ref, limit=limit)
    return UnaryCall(RELATIONS, request, timeout)


def memory_policy(
    value: str = "show", *, timeout: float | None = None
) -> UnaryCall[v1.PolicyResponse]:
    """The memory policy in force (``value="validate"``: with its range check)."""
    return UnaryCall(MEMORY_POLICY, v1.PolicyRequest(value=value), timeout)


def consolidate(
    *,
    all: bool = False,
    dry_run: bool = False,
    workspace: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.ConsolidateResponse]:
    """Decay, consolidate near-duplicates and compact (facts, or every store with
    ``all``); ``dry_run`` computes on a copy and writes nothing."""
    request = v1.ConsolidateRequest(workspace=workspace, all=all, dry_run=dry_run)
    return UnaryCall(CONSOLIDATE, request, timeout)


def restore(
    *,
    store: str = "facts",
    query: str = "",
    limit: int = 0,
    workspace: str = "",
    timeout: float | None = None,
) -> UnaryCall[v1.RestoreResponse]:
    """Bring archived entries back (most recently archived first; 0 = 10)."""
    request = v1.RestoreRequest(workspace=workspace, store=store, query=query, limit=limit)
    return UnaryCall(RESTORE, request, timeout)
