"""Typed clients for the Knowledge Service (sync and async).

Both speak grpcio over one channel and exchange the typed betterproto2 messages in
``knowledge_sdk.types``. Every RPC has one method; unary calls retry UNAVAILABLE
with backoff within their deadline; every failure is a ``knowledge_sdk.errors``
exception.

    from knowledge_sdk import KnowledgeClient
    with KnowledgeClient("127.0.0.1:50151") as kc:
        resp = kc.search("who fixed the MySQL access?")
        for item in resp.lanes.code.items:
            print(f"{item.path}:{item.start_line}")
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TypeVar

import betterproto2
import grpc

from knowledge_sdk import errors
from knowledge_sdk._gen.knowledge import v1

T = TypeVar("T", bound=betterproto2.Message)

DEFAULT_ADDRESS = "127.0.0.1:50151"
DEFAULT_TIMEOUT = 30.0

_K = "/knowledge.v1.KnowledgeService/"
_D = "/knowledge.v1.DocGraphService/"
_I = "/knowledge.v1.IndexService/"


@dataclass(frozen=True)
class ConnectionSettings:
    """Where and how to connect. ``from_env`` reads KNOWLEDGE_ADDRESS, KNOWLEDGE_TOKEN,
    KNOWLEDGE_TLS_CA, KNOWLEDGE_TLS_CERT, KNOWLEDGE_TLS_KEY."""

    address: str = DEFAULT_ADDRESS
    token: str | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def from_env(cls, **overrides: Any) -> ConnectionSettings:
        env = os.environ

        def p(name: str) -> Path | None:
            return Path(env[name]) if env.get(name) else None

        values: dict[str, Any] = {
            "address": env.get("KNOWLEDGE_ADDRESS") or DEFAULT_ADDRESS,
            "token": env.get("KNOWLEDGE_TOKEN") or None,
            "tls_ca": p("KNOWLEDGE_TLS_CA"),
            "tls_cert": p("KNOWLEDGE_TLS_CERT"),
            "tls_key": p("KNOWLEDGE_TLS_KEY"),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        try:
            root = self.tls_ca.read_bytes() if self.tls_ca else None
            key = self.tls_key.read_bytes() if self.tls_key else None
            cert = self.tls_cert.read_bytes() if self.tls_cert else None
        except OSError as exc:
            raise errors.ConnectionConfigError(f"cannot read TLS file: {exc}") from None
        return grpc.ssl_channel_credentials(
            root_certificates=root, private_key=key, certificate_chain=cert
        )

    def metadata(self, request_id: str | None = None) -> list[tuple[str, str]]:
        md: list[tuple[str, str]] = []
        if self.token:
            md.append(("authorization", f"Bearer {self.token}"))
        if request_id:
            md.append(("x-request-id", request_id))
        return md


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


def _ser(msg: betterproto2.Message) -> bytes:
    return bytes(msg)


def _de(cls: type[T]) -> Any:
    return cls.parse


_RETRY_BASE = 0.05
_RETRY_MAX = 2.0


# Each client has its own connection: gRPC otherwise shares one connection between all
# channels of a process to the same address, so several clients in one process would all
# land on one serving process of a server running with workers > 1.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


def _backoff(attempt: int) -> float:
    return min(_RETRY_MAX, _RETRY_BASE * (2**attempt)) * (0.5 + random.random() / 2)


class KnowledgeClient:
    """Synchronous client. One method per RPC; see the module docstring."""

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        settings: ConnectionSettings | None = None,
        timeout: float | None = None,
    ) -> None:
        self.settings = settings or ConnectionSettings.from_env(
            address=address, token=token, timeout=timeout
        )
        creds = self.settings.credentials()
        target = self.settings.address
        self._channel = (
            grpc.secure_channel(target, creds, options=CHANNEL_OPTIONS)
            if creds
            else grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(
        self,
        path: str,
        request: betterproto2.Message,
        response: type[T],
        timeout: float | None,
        request_id: str | None = None,
    ) -> T:
        call = self._channel.unary_unary(
            path, request_serializer=_ser, response_deserializer=_de(response)
        )
        deadline = time.monotonic() + (timeout or self.settings.timeout)
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                return call(
                    request,
                    timeout=max(remaining, 0.001),
                    metadata=self.settings.metadata(request_id),
                )  # type: ignore[no-any-return]
            except grpc.RpcError as exc:
                err = errors.from_rpc_error(exc)
                pause = _backoff(attempt)
                if isinstance(err, errors.Unavailable) and time.monotonic() + pause < deadline:
                    attempt += 1
                    time.sleep(pause)
                    continue
                raise err from None

    def _stream(
        self, path: str, request: betterproto2.Message, response: type[T], timeout: float | None
    ) -> Iterator[T]:
        call = self._channel.unary_stream(
            path, request_serializer=_ser, response_deserializer=_de(response)
        )
        try:
            yield from call(request, timeout=timeout, metadata=self.settings.metadata())
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    # KnowledgeService
    def search(
        self, query: str | v1.SearchRequest, *, timeout: float | None = None, **kwargs: Any
    ) -> v1.SearchResponse:
        req = query if isinstance(query, v1.SearchRequest) else search_request(query, **kwargs)
        return self._unary(_K + "Search", req, v1.SearchResponse, timeout, req.request_id or None)

    def dispatch(
        self, task: str | v1.DispatchRequest, *, timeout: float | None = None, **kwargs: Any
    ) -> v1.DispatchResponse:
        req = task if isinstance(task, v1.DispatchRequest) else dispatch_request(task, **kwargs)
        return self._unary(
            _K + "Dispatch", req, v1.DispatchResponse, timeout, req.request_id or None
        )

    def get_episode(
        self, id: str, *, neighbours: int = 0, timeout: float | None = None
    ) -> v1.GetEpisodeResponse:
        return self._unary(
            _K + "GetEpisode",
            v1.GetEpisodeRequest(id=id, neighbours=neighbours),
            v1.GetEpisodeResponse,
            timeout,
        )

    def get_chunk(self, id: str, *, timeout: float | None = None) -> v1.GetChunkResponse:
        return self._unary(_K + "GetChunk", v1.GetChunkRequest(id=id), v1.GetChunkResponse, timeout)

    # DocGraphService
    def themes(
        self, *, scope: str = "", limit: int = 10, timeout: float | None = None
    ) -> v1.ThemesResponse:
        return self._unary(
            _D + "Themes", v1.ThemesRequest(scope=scope, limit=limit), v1.ThemesResponse, timeout
        )

    def entity_neighbors(
        self,
        entity: str,
        *,
        depth: int = 1,
        kind: str = "entity",
        limit: int = 25,
        timeout: float | None = None,
    ) -> v1.EntityNeighborsResponse:
        req = v1.EntityNeighborsRequest(entity=entity, depth=depth, kind=kind, limit=limit)
        return self._unary(_D + "EntityNeighbors", req, v1.EntityNeighborsResponse, timeout)

    def doc_relations(
        self, *, doc: str = "", entity: str = "", limit: int = 25, timeout: float | None = None
    ) -> v1.DocRelationsResponse:
        return self._unary(
            _D + "DocRelations",
            v1.DocRelationsRequest(doc=doc, entity=entity, limit=limit),
            v1.DocRelationsResponse,
            timeout,
        )

    def global_overview(
        self, *, limit: int = 10, timeout: float | None = None
    ) -> v1.GlobalOverviewResponse:
        return self._unary(
            _D + "GlobalOverview",
            v1.GlobalOverviewRequest(limit=limit),
            v1.GlobalOverviewResponse,
            timeout,
        )

    def search_levels(
        self, query: str, *, limit: int = 10, timeout: float | None = None
    ) -> v1.SearchLevelsResponse:
        return self._unary(
            _D + "SearchLevels",
            v1.SearchLevelsRequest(query=query, limit=limit),
            v1.SearchLevelsResponse,
            timeout,
        )

    # IndexService
    def index_workspace(
        self, root: str, *, full: bool = False, timeout: float | None = None
    ) -> Iterator[v1.IndexWorkspaceResponse]:
        return self._stream(
            _I + "IndexWorkspace",
            v1.IndexWorkspaceRequest(root=root, full=full),
            v1.IndexWorkspaceResponse,
            timeout,
        )

    def ingest_sessions(
        self, paths: Sequence[str] = (), *, timeout: float | None = None
    ) -> Iterator[v1.IngestSessionsResponse]:
        return self._stream(
            _I + "IngestSessions",
            v1.IngestSessionsRequest(paths=list(paths)),
            v1.IngestSessionsResponse,
            timeout,
        )

    def rebuild_derived(
        self, *, full: bool = False, timeout: float | None = None
    ) -> Iterator[v1.RebuildDerivedResponse]:
        return self._stream(
            _I + "RebuildDerived",
            v1.RebuildDerivedRequest(full=full),
            v1.RebuildDerivedResponse,
            timeout,
        )

    def build_doc_graph(
        self, request: v1.BuildDocGraphRequest | None = None, *, timeout: float | None = None
    ) -> Iterator[v1.BuildDocGraphResponse]:
        return self._stream(
            _I + "BuildDocGraph",
            request or v1.BuildDocGraphRequest(),
            v1.BuildDocGraphResponse,
            timeout,
        )

    def get_status(self, *, timeout: float | None = None) -> v1.GetStatusResponse:
        return self._unary(_I + "GetStatus", v1.GetStatusRequest(), v1.GetStatusResponse, timeout)


class AsyncKnowledgeClient:
    """Asynchronous client (grpc.aio). Same methods as KnowledgeClient, awaited;
    streaming methods are async iterators."""

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        settings: ConnectionSettings | None = None,
        timeout: float | None = None,
    ) -> None:
        self.settings = settings or ConnectionSettings.from_env(
            address=address, token=token, timeout=timeout
        )
        creds = self.settings.credentials()
        target = self.settings.address
        self._channel = (
            grpc.aio.secure_channel(target, creds, options=CHANNEL_OPTIONS)
            if creds
            else grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        )

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(
        self,
        path: str,
        request: betterproto2.Message,
        response: type[T],
        timeout: float | None,
        request_id: str | None = None,
    ) -> T:
        call = self._channel.unary_unary(
            path, request_serializer=_ser, response_deserializer=_de(response)
        )
        deadline = time.monotonic() + (timeout or self.settings.timeout)
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                return await call(
                    request,
                    timeout=max(remaining, 0.001),
                    metadata=self.settings.metadata(request_id),
                )  # type: ignore[no-any-return]
            except grpc.RpcError as exc:
                err = errors.from_rpc_error(exc)
                pause = _backoff(attempt)
                if isinstance(err, errors.Unavailable) and time.monotonic() + pause < deadline:
                    attempt += 1
                    await asyncio.sleep(pause)
                    continue
                raise err from None

    async def _stream(
        self, path: str, request: betterproto2.Message, response: type[T], timeout: float | None
    ) -> AsyncIterator[T]:
        call = self._channel.unary_stream(
            path, request_serializer=_ser, response_deserializer=_de(response)
        )
        try:
            async for item in call(request, timeout=timeout, metadata=self.settings.metadata()):
                yield item
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    async def search(
        self, query: str | v1.SearchRequest, *, timeout: float | None = None, **kwargs: Any
    ) -> v1.SearchResponse:
        req = query if isinstance(query, v1.SearchRequest) else search_request(query, **kwargs)
        return await self._unary(
            _K + "Search", req, v1.SearchResponse, timeout, req.request_id or None
        )

    async def dispatch(
        self, task: str | v1.DispatchRequest, *, timeout: float | None = None, **kwargs: Any
    ) -> v1.DispatchResponse:
        req = task if isinstance(task, v1.DispatchRequest) else dispatch_request(task, **kwargs)
        return await self._unary(
            _K + "Dispatch", req, v1.DispatchResponse, timeout, req.request_id or None
        )

    async def get_episode(
        self, id: str, *, neighbours: int = 0, timeout: float | None = None
    ) -> v1.GetEpisodeResponse:
        return await self._unary(
            _K + "GetEpisode",
            v1.GetEpisodeRequest(id=id, neighbours=neighbours),
            v1.GetEpisodeResponse,
            timeout,
        )

    async def get_chunk(self, id: str, *, timeout: float | None = None) -> v1.GetChunkResponse:
        return await self._unary(
            _K + "GetChunk", v1.GetChunkRequest(id=id), v1.GetChunkResponse, timeout
        )

    async def themes(
        self, *, scope: str = "", limit: int = 10, timeout: float | None = None
    ) -> v1.ThemesResponse:
        return await self._unary(
            _D + "Themes", v1.ThemesRequest(scope=scope, limit=limit), v1.ThemesResponse, timeout
        )

    async def entity_neighbors(
        self,
        entity: str,
        *,
        depth: int = 1,
        kind: str = "entity",
        limit: int = 25,
        timeout: float | None = None,
    ) -> v1.EntityNeighborsResponse:
        req = v1.EntityNeighborsRequest(entity=entity, depth=depth, kind=kind, limit=limit)
        return await self._unary(_D + "EntityNeighbors", req, v1.EntityNeighborsResponse, timeout)

    async def doc_relations(
        self, *, doc: str = "", entity: str = "", limit: int = 25, timeout: float | None = None
    ) -> v1.DocRelationsResponse:
        return await self._unary(
            _D + "DocRelations",
            v1.DocRelationsRequest(doc=doc, entity=entity, limit=limit),
            v1.DocRelationsResponse,
            timeout,
        )

    async def global_overview(
        self, *, limit: int = 10, timeout: float | None = None
    ) -> v1.GlobalOverviewResponse:
        return await self._unary(
            _D + "GlobalOverview",
            v1.GlobalOverviewRequest(limit=limit),
            v1.GlobalOverviewResponse,
            timeout,
        )

    async def search_levels(
        self, query: str, *, limit: int = 10, timeout: float | None = None
    ) -> v1.SearchLevelsResponse:
        return await self._unary(
            _D + "SearchLevels",
            v1.SearchLevelsRequest(query=query, limit=limit),
            v1.SearchLevelsResponse,
            timeout,
        )

    def index_workspace(
        self, root: str, *, full: bool = False, timeout: float | None = None
    ) -> AsyncIterator[v1.IndexWorkspaceResponse]:
        return self._stream(
            _I + "IndexWorkspace",
            v1.IndexWorkspaceRequest(root=root, full=full),
            v1.IndexWorkspaceResponse,
            timeout,
        )

    def ingest_sessions(
        self, paths: Sequence[str] = (), *, timeout: float | None = None
    ) -> AsyncIterator[v1.IngestSessionsResponse]:
        return self._stream(
            _I + "IngestSessions",
            v1.IngestSessionsRequest(paths=list(paths)),
            v1.IngestSessionsResponse,
            timeout,
        )

    def rebuild_derived(
        self, *, full: bool = False, timeout: float | None = None
    ) -> AsyncIterator[v1.RebuildDerivedResponse]:
        return self._stream(
            _I + "RebuildDerived",
            v1.RebuildDerivedRequest(full=full),
            v1.RebuildDerivedResponse,
            timeout,
        )

    def build_doc_graph(
        self, request: v1.BuildDocGraphRequest | None = None, *, timeout: float | None = None
    ) -> AsyncIterator[v1.BuildDocGraphResponse]:
        return self._stream(
            _I + "BuildDocGraph",
            request or v1.BuildDocGraphRequest(),
            v1.BuildDocGraphResponse,
            timeout,
        )

    async def get_status(self, *, timeout: float | None = None) -> v1.GetStatusResponse:
        return await self._unary(
            _I + "GetStatus", v1.GetStatusRequest(), v1.GetStatusResponse, timeout
        )


# RPC name -> SDK method name; the parity test checks it covers every RPC in the proto.
RPC_METHODS: dict[str, str] = {
    "knowledge.v1.KnowledgeService/Search": "search",
    "knowledge.v1.KnowledgeService/Dispatch": "dispatch",
    "knowledge.v1.KnowledgeService/GetEpisode": "get_episode",
    "knowledge.v1.KnowledgeService/GetChunk": "get_chunk",
    "knowledge.v1.DocGraphService/Themes": "themes",
    "knowledge.v1.DocGraphService/EntityNeighbors": "entity_neighbors",
    "knowledge.v1.DocGraphService/DocRelations": "doc_relations",
    "knowledge.v1.DocGraphService/GlobalOverview": "global_overview",
    "knowledge.v1.DocGraphService/SearchLevels": "search_levels",
    "knowledge.v1.IndexService/IndexWorkspace": "index_workspace",
    "knowledge.v1.IndexService/IngestSessions": "ingest_sessions",
    "knowledge.v1.IndexService/RebuildDerived": "rebuild_derived",
    "knowledge.v1.IndexService/BuildDocGraph": "build_doc_graph",
    "knowledge.v1.IndexService/GetStatus": "get_status",
}
