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
