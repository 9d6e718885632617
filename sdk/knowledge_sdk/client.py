"""Typed clients for the Knowledge Service (sync and async).

Both speak grpcio over one channel and exchange the typed betterproto2 messages in
``knowledge_sdk.types``. Every RPC has one method with real keyword parameters, written
once in ``_calls.py`` for both clients. Unary calls are retried on UNAVAILABLE by gRPC
itself (the channel's service config: a few attempts with backoff), so a client that
cannot reach the server fails within about a second instead of waiting out its
deadline. Every failure is a ``knowledge_sdk.errors`` exception.

    from knowledge_sdk import KnowledgeClient
    with KnowledgeClient("127.0.0.1:50151") as kc:
        resp = kc.search("who fixed the MySQL access?")
        if resp.lanes and resp.lanes.code:
            for item in resp.lanes.code.items:
                print(f"{item.path}:{item.start_line}")
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import typing
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import GenericAlias
from typing import Any, Concatenate, ParamSpec, Self, TypeVar, overload

import betterproto2
import grpc

from knowledge_sdk import _calls, errors
from knowledge_sdk._calls import RPCS, StreamCall, UnaryCall, dispatch_request, search_request

__all__ = [
    "CHANNEL_OPTIONS",
    "DEFAULT_ADDRESS",
    "DEFAULT_TIMEOUT",
    "RPC_METHODS",
    "AsyncKnowledgeClient",
    "ConnectionSettings",
    "KnowledgeClient",
    "dispatch_request",
    "search_request",
]

P = ParamSpec("P")
R = TypeVar("R", bound=betterproto2.Message)

DEFAULT_ADDRESS = "127.0.0.1:50151"
DEFAULT_TIMEOUT = 30.0

# RPC name -> SDK method name; the parity test checks it covers every RPC in the proto.
RPC_METHODS: dict[str, str] = {rpc.full_name: rpc.method for rpc in RPCS}

# UNAVAILABLE (server not reachable yet, or a source it needs down) is retried by gRPC,
# for the calls safe to send again (``SAFE_TO_REPEAT``):
# 3 attempts with backoffs of about 0.05 and 0.1 s, so an address where nothing listens
# fails in well under a second (also within a short --timeout), not at the deadline.
# Streams are not retried (index builds write; a caller restarts them on purpose), nor
# are Retrieve and Answer: the service already retried its dependencies inside its own
# end-to-end budget, and seed 002 leaves a retry of their UNAVAILABLE to the caller, when
# its own budget allows (with the same trace id).
# Only the calls the proto marks as free of side effects or idempotent
# (``idempotency_level``; a test keeps this list equal to the proto's) are sent again: a
# write whose answer was lost after the server did it (Remember, a knowledge-base admin
# write) would be done twice, a memory confirmed by itself, a topic created and then
# refused as taken.
SAFE_TO_REPEAT = frozenset(
    {
        "knowledge.v1.KnowledgeService/Search",
        "knowledge.v1.KnowledgeService/Dispatch",
        "knowledge.v1.KnowledgeService/GetEpisode",
        "knowledge.v1.KnowledgeService/GetChunk",
        "knowledge.v1.DocGraphService/Themes",
        "knowledge.v1.DocGraphService/EntityNeighbors",
        "knowledge.v1.DocGraphService/DocRelations",
        "knowledge.v1.DocGraphService/GlobalOverview",
        "knowledge.v1.DocGraphService/SearchLevels",
        "knowledge.v1.IndexService/GetStatus",
        "knowledge.v1.KnowledgeBaseAdminService/ListTopics",
        "knowledge.v1.KnowledgeBaseAdminService/GetTopic",
        "knowledge.v1.KnowledgeBaseAdminService/GetRevision",
        "knowledge.v1.KnowledgeBaseAdminService/WatchTask",
        "knowledge.v1.KnowledgeBaseAdminService/ListTags",
        "knowledge.v1.KnowledgeBaseAdminService/ListTemplates",
        "knowledge.v1.KnowledgeBaseAdminService/ListFeedback",
        "knowledge.v1.KnowledgeBaseAdminService/GetPolicy",
        "knowledge.v1.KnowledgeBaseService/Retrieve",
        "knowledge.v1.KnowledgeBaseService/Answer",
        "knowledge.v1.MemoryService/Recall",
        "knowledge.v1.MemoryService/Timeline",
        "knowledge.v1.MemoryService/Rooms",
        "knowledge.v1.MemoryService/Relations",
        "knowledge.v1.MemoryService/Policy",
    }
)
_RETRY_POLICY = {
    "maxAttempts": 3,
    "initialBackoff": "0.05s",
    "maxBackoff": "0.1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": rpc.service, "method": rpc.name}
                    for rpc in RPCS
                    if not rpc.streaming
                    and rpc.full_name in SAFE_TO_REPEAT
                    and rpc.service != "knowledge.v1.KnowledgeBaseService"
                ],
                "retryPolicy": _RETRY_POLICY,
            }
        ]
    }
)

# Each client has its own connection: gRPC otherwise shares one connection between all
# channels of a process to the same address, so several clients in one process would all
# land on one serving process of a server running with workers > 1.
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", SERVICE_CONFIG),
)


@dataclass(frozen=True)
class ConnectionSettings:
    """Where and how to connect. ``from_env`` reads KNOWLEDGE_ADDRESS, KNOWLEDGE_TOKEN,
    KNOWLEDGE_TLS_CA, KNOWLEDGE_TLS_CERT, KNOWLEDGE_TLS_KEY."""

    address: str = DEFAULT_ADDRESS
    # Never in the settings' repr (a traceback's locals, a log of the settings).
    token: str | None = field(default=None, repr=False)
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
        if isinstance(values["token"], str):
            # A token read from a file keeps its line break: trimmed, as by the
            # TypeScript client.
            values["token"] = values["token"].strip() or None
        return cls(**values)

    def __post_init__(self) -> None:
        # A certificate without its key aborted the process in gRPC's core (no exception
        # to catch); a key without a certificate left the channel in plain text, the token
        # with it.
        if bool(self.tls_cert) != bool(self.tls_key):
            given, missing = ("cert", "key") if self.tls_cert else ("key", "cert")
            raise errors.ConnectionConfigError(
                f"TLS client {given} given without its {missing}"
                " (KNOWLEDGE_TLS_CERT and KNOWLEDGE_TLS_KEY go together)"
            )
        # A header carries printable ASCII only: a token read from a file with its line
        # break, or holding other characters, failed every call as an internal error.
        if self.token is not None and not (
            self.token.isascii() and self.token.isprintable() and " " not in self.token
        ):
            raise errors.ConnectionConfigError(
                "the token is not printable ASCII without spaces (a line break from the"
                " file it was read from?)"
            )

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

    def metadata(
        self, request_id: str | None = None, trace_id: str | None = None
    ) -> list[tuple[str, str]]:
        md: list[tuple[str, str]] = []
        if self.token:
            md.append(("authorization", f"Bearer {self.token}"))
        if request_id:
            md.append(("x-request-id", request_id))
        if trace_id:
            md.append(("x-trace-id", trace_id))
        return md


def _serialize(message: betterproto2.Message) -> bytes:
    return bytes(message)


def _call_kind(op: Callable[..., object]) -> tuple[type, type]:
    """(UnaryCall or StreamCall, response class) from an operation's return annotation."""
    hint = typing.get_type_hints(op)["return"]
    return typing.get_origin(hint), typing.get_args(hint)[0]


def _as_method(
    method: Callable[..., Any], op: Callable[..., object], owner: str, returns: object
) -> None:
    """Give ``method`` the name, docs and signature of ``op``, with ``self`` first."""
    sig = inspect.signature(op)
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__name__ = op.__name__
    method.__qualname__ = f"{owner}.{op.__name__}"
    method.__doc__ = op.__doc__
    method.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[this, *sig.parameters.values()], return_annotation=returns
    )


class _Client:
    """What both clients share: settings, the channel's options, call metadata, errors."""

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
        self._credentials = self.settings.credentials()
        # Set by close(): a call then is ClientClosed, not gRPC's own error for a closed
        # channel (a ValueError from one client, a UsageError from the other).
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosed("the client is closed; make a new one")

    def _deadline(self, call: UnaryCall[Any] | StreamCall[Any]) -> float | None:
        if isinstance(call, StreamCall):
            return call.timeout
        return call.timeout if call.timeout is not None else self.settings.timeout

    def _metadata(self, call: UnaryCall[Any] | StreamCall[Any]) -> tuple[tuple[str, str], ...]:
        if isinstance(call, UnaryCall):
            return tuple(self.settings.metadata(call.request_id, call.trace_id))
        return tuple(self.settings.metadata(None))

    def _error(self, exc: grpc.RpcError) -> errors.RPCError:
        return errors.from_rpc_error(exc, address=self.settings.address)


@overload
def _sync(
    op: Callable[P, UnaryCall[R]],
) -> Callable[Concatenate[KnowledgeClient, P], R]: ...
@overload
def _sync(
    op: Callable[P, StreamCall[R]],
) -> Callable[Concatenate[KnowledgeClient, P], Iterator[R]]: ...
def _sync(op: Callable[..., Any]) -> Callable[..., Any]:
    """The sync client's method for an operation of ``_calls``."""
    kind, response = _call_kind(op)

    def method(self: KnowledgeClient, *args: Any, **kwargs: Any) -> Any:
        call = op(*args, **kwargs)
        if isinstance(call, StreamCall):
            return self._stream(call)
        return self._unary(call)

    _as_method(
        method,
        op,
        "KnowledgeClient",
        GenericAlias(Iterator, (response,)) if kind is StreamCall else response,
    )
    return method


@overload
def _async(
    op: Callable[P, UnaryCall[R]],
) -> Callable[Concatenate[AsyncKnowledgeClient, P], Coroutine[Any, Any, R]]: ...
@overload
def _async(
    op: Callable[P, StreamCall[R]],
) -> Callable[Concatenate[AsyncKnowledgeClient, P], AsyncIterator[R]]: ...
def _async(op: Callable[..., Any]) -> Callable[..., Any]:
    """The async client's method for an operation of ``_calls``: a coroutine function
    for a unary RPC, a function returning an async iterator for a streaming one."""
    kind, response = _call_kind(op)
    method: Callable[..., Any]
    if kind is StreamCall:

        def method(self: AsyncKnowledgeClient, *args: Any, **kwargs: Any) -> Any:
            return self._stream(op(*args, **kwargs))

        _as_method(method, op, "AsyncKnowledgeClient", GenericAlias(AsyncIterator, (response,)))
    else:

        async def method(self: AsyncKnowledgeClient, *args: Any, **kwargs: Any) -> Any:
            return await self._unary(op(*args, **kwargs))

        _as_method(method, op, "AsyncKnowledgeClient", response)
    return method


class KnowledgeClient(_Client):
    """Synchronous client. One method per RPC; see the module docstring."""

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        settings: ConnectionSettings | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(address, token=token, settings=settings, timeout=timeout)
        target, creds = self.settings.address, self._credentials
        self._channel = (
            grpc.secure_channel(target, creds, options=CHANNEL_OPTIONS)
            if creds
            else grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        )

    def close(self) -> None:
        self._closed = True
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, call: UnaryCall[R]) -> R:
        self._check_open()
        rpc = call.rpc
        try:
            send = self._channel.unary_unary(
                rpc.path, request_serializer=_serialize, response_deserializer=rpc.response.parse
            )
            response: R = send(
                call.request, timeout=self._deadline(call), metadata=self._metadata(call)
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        except ValueError:
            self._closed_between()
            raise
        return response

    def _closed_between(self) -> None:
        """gRPC's ValueError for a channel closed by another thread between the open
        check and the call: ClientClosed, as a call after close is."""
        if self._closed:
            raise errors.ClientClosed("the client was closed during the call") from None

    def _stream(self, call: StreamCall[R]) -> Iterator[R]:
        self._check_open()
        rpc = call.rpc
        try:
            send = self._channel.unary_stream(
                rpc.path, request_serializer=_serialize, response_deserializer=rpc.response.parse
            )
            yield from send(
                call.request, timeout=self._deadline(call), metadata=self._metadata(call)
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        except ValueError:
            self._closed_between()
            raise

    # KnowledgeService
    search = _sync(_calls.search)
    dispatch = _sync(_calls.dispatch)
    get_episode = _sync(_calls.get_episode)
    get_chunk = _sync(_calls.get_chunk)
    # DocGraphService
    themes = _sync(_calls.themes)
    entity_neighbors = _sync(_calls.entity_neighbors)
    doc_relations = _sync(_calls.doc_relations)
    global_overview = _sync(_calls.global_overview)
    search_levels = _sync(_calls.search_levels)
    # IndexService
    index_workspace = _sync(_calls.index_workspace)
    ingest_sessions = _sync(_calls.ingest_sessions)
    rebuild_derived = _sync(_calls.rebuild_derived)
    build_doc_graph = _sync(_calls.build_doc_graph)
    get_status = _sync(_calls.get_status)
    # KnowledgeBaseAdminService
    kb_create_topic = _sync(_calls.kb_create_topic)
    kb_list_topics = _sync(_calls.kb_list_topics)
    kb_get_topic = _sync(_calls.kb_get_topic)
    kb_create_revision = _sync(_calls.kb_create_revision)
    kb_get_revision = _sync(_calls.kb_get_revision)
    kb_update_revision = _sync(_calls.kb_update_revision)
    kb_upload_source_piece = _sync(_calls.kb_upload_source_piece)
    kb_put_faq = _sync(_calls.kb_put_faq)
    kb_remove_source = _sync(_calls.kb_remove_source)
    kb_submit = _sync(_calls.kb_submit)
    kb_approve = _sync(_calls.kb_approve)
    kb_return = _sync(_calls.kb_return)
    kb_process = _sync(_calls.kb_process)
    kb_retry_task = _sync(_calls.kb_retry_task)
    kb_cancel_task = _sync(_calls.kb_cancel_task)
    kb_watch_task = _sync(_calls.kb_watch_task)
    kb_publish = _sync(_calls.kb_publish)
    kb_rollback = _sync(_calls.kb_rollback)
    kb_offline = _sync(_calls.kb_offline)
    kb_reconcile = _sync(_calls.kb_reconcile)
    kb_create_tag = _sync(_calls.kb_create_tag)
    kb_update_tag = _sync(_calls.kb_update_tag)
    kb_list_tags = _sync(_calls.kb_list_tags)
    kb_put_template = _sync(_calls.kb_put_template)
    kb_list_templates = _sync(_calls.kb_list_templates)
    kb_create_feedback = _sync(_calls.kb_create_feedback)
    kb_list_feedback = _sync(_calls.kb_list_feedback)
    kb_resolve_feedback = _sync(_calls.kb_resolve_feedback)
    kb_get_policy = _sync(_calls.kb_get_policy)
    kb_set_policy = _sync(_calls.kb_set_policy)
    # KnowledgeBaseService
    kb_retrieve = _sync(_calls.kb_retrieve)
    kb_answer = _sync(_calls.kb_answer)
    # MemoryService
    remember = _sync(_calls.remember)
    recall = _sync(_calls.recall)
    timeline = _sync(_calls.timeline)
    rooms = _sync(_calls.rooms)
    relations = _sync(_calls.relations)
    memory_policy = _sync(_calls.memory_policy)
    consolidate = _sync(_calls.consolidate)
    restore = _sync(_calls.restore)


class AsyncKnowledgeClient(_Client):
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
        super().__init__(address, token=token, settings=settings, timeout=timeout)
        target, creds = self.settings.address, self._credentials
        self._channel = (
            grpc.aio.secure_channel(target, creds, options=CHANNEL_OPTIONS)
            if creds
            else grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        )

    async def close(self) -> None:
        self._closed = True
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, call: UnaryCall[R]) -> R:
        self._check_open()
        rpc = call.rpc
        send = self._channel.unary_unary(
            rpc.path, request_serializer=_serialize, response_deserializer=rpc.response.parse
        )
        try:
            response: R = await send(
                call.request, timeout=self._deadline(call), metadata=self._metadata(call)
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        except asyncio.CancelledError:
            self._closed_under(call)
            raise
        return response

    def _closed_under(self, call: UnaryCall[Any] | StreamCall[Any]) -> None:
        """A call cancelled because the client was closed under it (not because its own
        task was cancelled) is ClientClosed, as the sync client's is a KnowledgeError;
        it surfaced as asyncio's CancelledError, which callers take for their own."""
        task = asyncio.current_task()
        if self._closed and (task is None or not task.cancelling()):
            raise errors.ClientClosed(
                f"the client was closed during {call.rpc.full_name}"
            ) from None

    async def _stream(self, call: StreamCall[R]) -> AsyncIterator[R]:
        self._check_open()
        rpc = call.rpc
        send = self._channel.unary_stream(
            rpc.path, request_serializer=_serialize, response_deserializer=rpc.response.parse
        )
        running = send(call.request, timeout=self._deadline(call), metadata=self._metadata(call))
        try:
            async for item in running:
                yield item
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        except asyncio.CancelledError:
            self._closed_under(call)
            raise
        finally:
            # A caller that leaves the loop (break, return, an exception) ends the stream
            # on the wire, as the sync client's does; left to itself it ran until the
            # client was closed.
            running.cancel()

    # KnowledgeService
    search = _async(_calls.search)
    dispatch = _async(_calls.dispatch)
    get_episode = _async(_calls.get_episode)
    get_chunk = _async(_calls.get_chunk)
    # DocGraphService
    themes = _async(_calls.themes)
    entity_neighbors = _async(_calls.entity_neighbors)
    doc_relations = _async(_calls.doc_relations)
    global_overview = _async(_calls.global_overview)
    search_levels = _async(_calls.search_levels)
    # IndexService
    index_workspace = _async(_calls.index_workspace)
    ingest_sessions = _async(_calls.ingest_sessions)
    rebuild_derived = _async(_calls.rebuild_derived)
    build_doc_graph = _async(_calls.build_doc_graph)
    get_status = _async(_calls.get_status)
    # KnowledgeBaseAdminService
    kb_create_topic = _async(_calls.kb_create_topic)
    kb_list_topics = _async(_calls.kb_list_topics)
    kb_get_topic = _async(_calls.kb_get_topic)
    kb_create_revision = _async(_calls.kb_create_revision)
    kb_get_revision = _async(_calls.kb_get_revision)
    kb_update_revision = _async(_calls.kb_update_revision)
    kb_upload_source_piece = _async(_calls.kb_upload_source_piece)
    kb_put_faq = _async(_calls.kb_put_faq)
    kb_remove_source = _async(_calls.kb_remove_source)
    kb_submit = _async(_calls.kb_submit)
    kb_approve = _async(_calls.kb_approve)
    kb_return = _async(_calls.kb_return)
    kb_process = _async(_calls.kb_process)
    kb_retry_task = _async(_calls.kb_retry_task)
    kb_cancel_task = _async(_calls.kb_cancel_task)
    kb_watch_task = _async(_calls.kb_watch_task)
    kb_publish = _async(_calls.kb_publish)
    kb_rollback = _async(_calls.kb_rollback)
    kb_offline = _async(_calls.kb_offline)
    kb_reconcile = _async(_calls.kb_reconcile)
    kb_create_tag = _async(_calls.kb_create_tag)
    kb_update_tag = _async(_calls.kb_update_tag)
    kb_list_tags = _async(_calls.kb_list_tags)
    kb_put_template = _async(_calls.kb_put_template)
    kb_list_templates = _async(_calls.kb_list_templates)
    kb_create_feedback = _async(_calls.kb_create_feedback)
    kb_list_feedback = _async(_calls.kb_list_feedback)
    kb_resolve_feedback = _async(_calls.kb_resolve_feedback)
    kb_get_policy = _async(_calls.kb_get_policy)
    kb_set_policy = _async(_calls.kb_set_policy)
    # KnowledgeBaseService
    kb_retrieve = _async(_calls.kb_retrieve)
    kb_answer = _async(_calls.kb_answer)
    # MemoryService
    remember = _async(_calls.remember)
    recall = _async(_calls.recall)
    timeline = _async(_calls.timeline)
    rooms = _async(_calls.rooms)
    relations = _async(_calls.relations)
    memory_policy = _async(_calls.memory_policy)
    consolidate = _async(_calls.consolidate)
    restore = _async(_calls.restore)
