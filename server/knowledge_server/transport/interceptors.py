"""Server interceptors: call context and logging, authentication, the edition gate,
the declared size limits of requests.

Every decision that can be made from the method name and the call metadata is made
in ``intercept_service``; a refused call gets an aborting handler *of the same kind*
as the RPC (unary or server-streaming), so streaming RPCs are refused exactly like
unary ones. Allowed calls get a wrapped handler that binds the per-call context
(request id, method, peer, principal) in contextvars for the handler and the logs.

Only ``knowledge.v1`` methods are intercepted; health checking and reflection are
open (they reveal no data).

Request bytes that do not decode as the method's request message answer
``INVALID_ARGUMENT`` with a fixed message (never the parser's exception or the message
type), whoever the caller is: the deserializer returns a marker instead of raising, and
the outermost interceptor refuses the marker before any other check runs.
"""

from __future__ import annotations

import contextvars
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
import structlog
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from knowledge_server import errors
from knowledge_server._gen.knowledge.v1 import errors_pb2
from knowledge_server.auth_model import LOCAL_PRINCIPAL, Principal
from knowledge_server.deadline import REQUEST_DEADLINE
from knowledge_server.edition import EditionState
from knowledge_server.transport.policy import EDITION_NAMES, POLICIES, Policy
from knowledge_server.transport.rules import check_limits

log = structlog.get_logger("knowledge.rpc")

PREFIX = "/knowledge.v1."


@dataclass(frozen=True)
class CallContext:
    request_id: str
    method: str
    peer: str
    principal: Principal


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "knowledge_call", default=None
)


def current_call() -> CallContext:
    ctx = _current.get()
    if ctx is None:
        # Only reachable when application code is called outside an RPC (tests, CLI).
        return CallContext("local", "", "local", LOCAL_PRINCIPAL)
    return ctx


def _metadata(details: grpc.HandlerCallDetails) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in details.invocation_metadata or ():
        if isinstance(value, str):
            out[key.lower()] = value
    return out


def status_for(err: errors.KnowledgeError, extra: list[Any] | None = None) -> status_pb2.Status:
    info = error_details_pb2.ErrorInfo(
        reason=err.reason, domain=errors.DOMAIN, metadata=err.metadata
    )
    details = []
    for msg in [info, *(extra or [])]:
        packed = any_pb2.Any()
        packed.Pack(msg)
        details.append(packed)
    return status_pb2.Status(code=err.code.value[0], message=err.message, details=details)


async def abort(
    context: Context, err: errors.KnowledgeError, extra: list[Any] | None = None
) -> None:
    await context.abort_with_status(rpc_status.to_status(status_for(err, extra)))


Behavior = Callable[..., Any]
# grpc's classes are generic in its type stubs only; at run time they are not subscriptable.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Continuation: TypeAlias = "Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]"


class _Undecodable:
    """What the request deserializer returns for bytes that are not a valid message."""

    __slots__ = ()


UNDECODABLE = _Undecodable()


def _undecodable() -> errors.InvalidRequest:
    return errors.InvalidRequest(
        "request: the bytes are not a valid request message for this method",
        metadata={"field": "request"},
    )


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserialize`` returning :data:`UNDECODABLE` instead of raising ``DecodeError``
    (grpc would answer UNKNOWN with the exception's text)."""
    if deserialize is None:
        return None
    inner = deserialize

    def run(data: bytes) -> Any:
        try:
            return inner(data)
        except DecodeError:
            return UNDECODABLE

    return run


def _decoded_unary(fn: Behavior) -> Behavior:
    """``fn``, refusing the marker of an undecodable request before it runs."""

    async def run(request: Any, context: Context) -> Any:
        if request is UNDECODABLE:
            raise _undecodable()
        return await _call_unary(fn, request, context)

    return run


def _decoded_stream(fn: Behavior) -> Behavior:
    async def run(request: Any, context: Context) -> AsyncIterator[Any]:
        if request is UNDECODABLE:
            raise _undecodable()
        async for item in fn(request, context):
            yield item

    return run


def _rewrap(
    handler: Handler,
    unary: Callable[[Behavior], Behavior],
    stream: Callable[[Behavior], Behavior],
    deserializer: Callable[[bytes], Any] | None = None,
) -> Handler | None:
    """Same kind of handler with its behaviour (and optionally its deserializer) wrapped."""
    if handler.request_streaming:
        return handler  # knowledge.v1 has no client-streaming RPCs
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            stream(_present(handler.unary_stream)),
            request_deserializer=deserializer or handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.unary_unary_rpc_method_handler(
        unary(_present(handler.unary_unary)),
        request_deserializer=deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _present(behavior: Behavior | None) -> Behavior:
    if behavior is None:
        raise TypeError("a handler of this kind has no behaviour of that kind")
    return behavior


def refusing_handler(
    handler: Handler, err: errors.KnowledgeError, extra: list[Any] | None = None
) -> Handler | None:
    """An aborting handler of the same kind as ``handler``."""

    def unary(_: Behavior) -> Behavior:
        async def refuse(request: Any, context: Context) -> Any:
            _log_refusal(err)
            await abort(context, err, extra)

        return refuse

    def stream(_: Behavior) -> Behavior:
        async def refuse(request: Any, context: Context) -> AsyncIterator[Any]:
            _log_refusal(err)
            await abort(context, err, extra)
            yield  # pragma: no cover - abort raises

        return refuse

    return _rewrap(handler, unary, stream)


def _log_refusal(err: errors.KnowledgeError) -> None:
    log.info("rpc.refused", code=err.code.name, reason=err.reason)


async def _call_unary(fn: Behavior, request: Any, context: Context) -> Any:
    result = fn(request, context)
    if inspect.isawaitable(result):
        result = await result
    return result


class ContextInterceptor(grpc.aio.ServerInterceptor):
    """Binds request_id / method / peer, logs one line per call, maps domain errors.

    A raw exception never leaves a handler: domain errors become their gRPC status
    with ErrorInfo; anything else becomes INTERNAL / KNOWLEDGE_INTERNAL, logged with
    its type only (an exception message may quote user text).
    """

    async def intercept_service(
        self,
        continuation: Continuation,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(PREFIX):
            return handler
        md = _metadata(handler_call_details)
        request_id = md.get("x-request-id", "")[:128] or uuid.uuid4().hex[:16]

        def begin(
            context: Context,
        ) -> tuple[float, contextvars.Token[CallContext | None] | None]:
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(
                request_id=request_id, rpc_method=method, peer=context.peer()
            )
            return time.perf_counter(), None

        def bind_deadline(context: Context) -> None:
            # The caller's deadline, for the work a unary handler runs (deadline.py); it
            # runs in this call's own task, so the value is this call's alone. Operator
            # streams are not bound: their work is not the call's (it goes on, and is
            # committed, when the caller stops listening).
            left = context.time_remaining()
            REQUEST_DEADLINE.set(None if left is None else time.monotonic() + left)

        async def fail(context: Context, exc: BaseException, started: float) -> None:
            if isinstance(exc, errors.KnowledgeError):
                log.info("rpc.error", code=exc.code.name, reason=exc.reason, ms=_ms(started))
                await abort(context, exc)
            log.error("rpc.internal_error", error_type=type(exc).__name__, ms=_ms(started))
            await abort(
                context,
                errors.InternalError(
                    "internal error; see the server log for request " + request_id
                ),
            )

        def unary(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> Any:
                started, _ = begin(context)
                bind_deadline(context)
                context.set_trailing_metadata((("x-request-id", request_id),))
                try:
                    result = await _call_unary(fn, request, context)
                except (errors.KnowledgeError, Exception) as exc:
                    if _is_abort(exc, context):
                        raise
                    await fail(context, exc, started)
                    raise AssertionError("unreachable") from exc  # pragma: no cover
                log.info("rpc.ok", ms=_ms(started))
                return result

            return run

        def stream(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> AsyncIterator[Any]:
                started, _ = begin(context)
                sent = 0
                try:
                    async for item in fn(request, context):
                        sent += 1
                        yield item
                except (errors.KnowledgeError, Exception) as exc:
                    if _is_abort(exc, context):
                        raise
                    await fail(context, exc, started)
                log.info("rpc.ok", ms=_ms(started), messages=sent)

            return run

        return _rewrap(
            handler,
            lambda fn: unary(_decoded_unary(fn)),
            lambda fn: stream(_decoded_stream(fn)),
            _tolerant(handler.request_deserializer),
        )


def _is_abort(exc: BaseException, context: Context) -> bool:
    # context.abort() raises an internal exception type; let it through untouched.
    return type(exc).__name__ == "AbortError" or isinstance(exc, grpc.aio.AbortError)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Maps the bearer token to a principal and checks the method's right.

    With authentication off (loopback default) every call runs as the local
    principal. Missing or bad token -> UNAUTHENTICATED (no hint whether a token
    exists); a role without the right -> PERMISSION_DENIED.
    """

    def __init__(
        self,
        authenticate: Callable[[str], Principal | None] | None,
        local: Principal = LOCAL_PRINCIPAL,
    ) -> None:
        self._authenticate = authenticate
        self._local = local

    async def intercept_service(
        self,
        continuation: Continuation,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(PREFIX):
            return handler
        principal: Principal | None
        if self._authenticate is None:
            principal = self._local
        else:
            # Exactly one authorization header: with two, which one a proxy or a server
            # reads differs, so a call carrying two is refused rather than guessed at.
            headers = [
                value
                for key, value in handler_call_details.invocation_metadata or ()
                if key.lower() == "authorization"
            ]
            header = headers[0] if len(headers) == 1 and isinstance(headers[0], str) else ""
            token = header[7:].strip() if header[:7].lower() == "bearer " else ""
            principal = self._authenticate(token) if token else None
            if principal is None:
                return refusing_handler(
                    handler, errors.Unauthenticated("missing or invalid bearer token")
                )
        policy = POLICIES.get(method, Policy())
        if not policy.allows(principal):
            return refusing_handler(
                handler,
                errors.PermissionDenied(
                    f"role {principal.role!r} may not call {method.rsplit('/', 1)[-1]}:"
                    f" it needs the {policy.needs()} capability, which this token does not hold"
                ),
            )
        ctx_principal = principal

        def unary(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> Any:
                token = _current.set(
                    CallContext(_request_id(), method, context.peer(), ctx_principal)
                )
                structlog.contextvars.bind_contextvars(principal=ctx_principal.id)
                try:
                    return await _call_unary(fn, request, context)
                finally:
                    _current.reset(token)

            return run

        def stream(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> AsyncIterator[Any]:
                token = _current.set(
                    CallContext(_request_id(), method, context.peer(), ctx_principal)
                )
                structlog.contextvars.bind_contextvars(principal=ctx_principal.id)
                try:
                    async for item in fn(request, context):
                        yield item
                finally:
                    _current.reset(token)

            return run

        return _rewrap(handler, unary, stream)


def _request_id() -> str:
    return str(structlog.contextvars.get_contextvars().get("request_id", ""))


class EditionInterceptor(grpc.aio.ServerInterceptor):
    """The edition gate: refuses RPCs whose declared feature the edition lacks.

    The feature comes from the ``(knowledge.v1.policy)`` method option in the proto;
    the current edition is read per call, so a reloaded licence takes effect at once.
    No handler checks the licence itself.
    """

    def __init__(self, edition: Callable[[], EditionState]) -> None:
        self._edition = edition

    async def intercept_service(
        self,
        continuation: Continuation,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(PREFIX):
            return handler
        policy = POLICIES.get(method)
        if policy is None or not policy.feature:
            return handler
        state = self._edition()
        if policy.feature in state.features:
            return handler
        required = EDITION_NAMES.get(policy.edition, "enterprise")
        short = method.rsplit("/", 1)[-1]
        article = "an" if required[:1] in "aeiou" else "a"
        message = (
            f"{short} needs the {required} edition (feature {policy.feature!r}); "
            f"this server runs as {state.edition} (licence {state.licence_state}). "
            f"To get it, obtain {article} {required} licence file from the vendor and install it "
            "with `knowledge license install FILE` (see docs/licensing.md)"
        )
        refusal = errors_pb2.EditionRefusal(
            feature=policy.feature,
            required_edition=required,
            current_edition=state.edition,
            licence_state=state.licence_state,
            method=method,
            message=message,
        )
        err = errors.EditionRequired(
            message,
            metadata={
                "feature": policy.feature,
                "required_edition": required,
                "current_edition": state.edition,
            },
        )
        return refusing_handler(handler, err, [refusal])


class LimitsInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a request exceeding a declared ``max_items`` or ``max_length`` anywhere in
    it (``transport/rules.py``), for every RPC, before the servicer runs. Installed
    innermost, so the caller has been authenticated and the edition checked first."""

    async def intercept_service(
        self,
        continuation: Continuation,
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(PREFIX):
            return handler

        def unary(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> Any:
                check_limits(request)
                return await _call_unary(fn, request, context)

            return run

        def stream(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> AsyncIterator[Any]:
                check_limits(request)
                async for item in fn(request, context):
                    yield item

            return run

        return _rewrap(handler, unary, stream)
