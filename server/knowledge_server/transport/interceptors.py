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

import collections
import contextlib
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
from knowledge_server._gen.knowledge.v1 import errors_pb2, kb_retrieve_pb2, search_pb2
from knowledge_server.auth_model import LOCAL_PRINCIPAL, Principal
from knowledge_server.deadline import REQUEST_DEADLINE
from knowledge_server.edition import EditionState
from knowledge_server.kb.retrieve import valid_trace_id
from knowledge_server.metrics import OPERATIONS, Metrics, reason_code
from knowledge_server.tracing import Tracing
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


# The status codes a call aborted with (ContextInterceptor reads the last one for its
# metrics and span); one list per call, set where the call starts.
_aborted: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "knowledge_aborted", default=None
)


class _Status(
    collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status
):
    pass


async def abort(
    context: Context, err: errors.KnowledgeError, extra: list[Any] | None = None
) -> None:
    codes = _aborted.get()
    if codes is not None:
        codes.append(err.code.name)
    status = rpc_status.to_status(status_for(err, extra))
    request_id = _request_id()
    if request_id:
        # The status replaces the trailers set before: the request id goes with it, so a
        # refused or failed call can be found in the log too.
        status = _Status(
            status.code,
            status.details,
            (*status.trailing_metadata, ("x-request-id", request_id)),
        )
    await context.abort_with_status(status)


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
    handler: Handler,
    err: errors.KnowledgeError,
    extra: list[Any] | None = None,
    on_refusal: Callable[[], None] | None = None,
) -> Handler | None:
    """An aborting handler of the same kind as ``handler``; ``on_refusal`` is told when
    it refuses a call (not when an outer interceptor put a refusal of its own first)."""

    def refused() -> None:
        _log_refusal(err)
        if on_refusal is not None:
            on_refusal()

    def unary(_: Behavior) -> Behavior:
        async def refuse(request: Any, context: Context) -> Any:
            refused()
            await abort(context, err, extra)

        return refuse

    def stream(_: Behavior) -> Behavior:
        async def refuse(request: Any, context: Context) -> AsyncIterator[Any]:
            refused()
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


def _body_request_id(request: Any) -> str:
    """The ``request_id`` a request body carries (Search, Dispatch), else "". Only an id
    of printable ASCII is taken (what metadata can carry back, and a log line can hold
    without escaping); another is left to the answer's body."""
    value = getattr(request, "request_id", "")
    if not isinstance(value, str) or not value or len(value) > 128:
        return ""
    return value if value.isascii() and value.isprintable() else ""


def _notices(result: Any) -> dict[str, Any]:
    """The warning, error and degradation codes of an answer (no text)."""
    out: dict[str, Any] = {}
    for name in ("warnings", "errors"):
        notices = getattr(result, name, None)
        if notices:
            out[name] = [f"{n.code}:{n.lane}" if n.lane else n.code for n in notices]
    lanes = getattr(result, "lanes", None)
    if isinstance(lanes, search_pb2.Lanes):
        degraded = {
            lane: reason_code(getattr(lanes, lane).degradation_reason)
            for lane in ("episodes", "code", "skills")
            if getattr(lanes, lane).degraded
        }
        if degraded:
            out["degraded"] = degraded
    return out


def _log_ok(result: Any, started: float) -> None:
    """One line per answer. A partial one (errors or degraded lanes) is a warning; an
    answer whose notices are warnings only (e.g. trimmed to its budget) stays info."""
    notices = _notices(result)
    if "errors" in notices or "degraded" in notices:
        log.warning("rpc.ok", ms=_ms(started), partial=True, **notices)
    else:
        log.info("rpc.ok", ms=_ms(started), **notices)


# How close to its deadline a call cut off without a code may end and still count as
# DEADLINE_EXCEEDED: the caller's own timer fires first and its cancellation reaches the
# server before the server's timer does (the deadline travels as time left, and the
# network takes its share of it). Small, since a caller's own cancel within it is counted
# as a deadline too.
_DEADLINE_SLACK_S = 0.05


class _Observed:
    """One call's metrics and span: started with the call, finished with its status code
    (the last code the call aborted with, else OK or, cut off without one,
    DEADLINE_EXCEEDED when the caller's deadline had passed, else CANCELLED)."""

    __slots__ = (
        "codes",
        "context",
        "method",
        "metrics",
        "span",
        "started",
        "summary",
        "token",
        "tracing",
    )

    def __init__(
        self,
        metrics: Metrics | None,
        tracing: Tracing | None,
        method: str,
        request_id: str,
        context: Context,
        *,
        current: bool,
    ) -> None:
        self.metrics, self.tracing, self.method = metrics, tracing, method
        self.context = context
        self.started = time.perf_counter()
        self.codes: list[str] = []
        _aborted.set(self.codes)
        self.summary: Any = None
        self.span: Any = None
        self.token: object | None = None
        if tracing is not None:
            if current:
                self.span, self.token = tracing.start_rpc(method, request_id)
            else:
                self.span = tracing.start_stream(method, request_id)

    def item(self, item: Any) -> None:
        """A streamed message: an operator stream's summary is kept for the metrics."""
        if self.method in OPERATIONS and item.HasField("summary"):
            self.summary = item.summary

    def cut_off(self) -> str:
        """The code the caller of a call cut off without one got. gRPC ends a call at its
        caller's deadline as it ends one the caller cancelled (the handler's task is
        cancelled); only the time the call had left tells them apart."""
        left = self.context.time_remaining()
        return (
            "DEADLINE_EXCEEDED" if left is not None and left <= _DEADLINE_SLACK_S else "CANCELLED"
        )

    def finish(self, ok: bool, sent: int | None = None) -> None:
        code = self.codes[-1] if self.codes else ("OK" if ok else self.cut_off())
        seconds = time.perf_counter() - self.started
        if self.metrics is not None:
            self.metrics.rpc(self.method, code, seconds)
            if sent is not None:
                self.metrics.operation(
                    self.method, self.summary if ok else None, seconds, ended=None if ok else code
                )
        if self.tracing is not None:
            extra = {"knowledge.messages": sent} if sent is not None else None
            self.tracing.end_rpc(self.span, self.token, code, extra)


class ContextInterceptor(grpc.aio.ServerInterceptor):
    """Binds request_id / method / peer, logs one line per call, maps domain errors,
    counts and times calls (``metrics``) and opens their spans (``tracing``).

    The request id is the one the request body carries (``request_id`` of Search and
    Dispatch), else the ``x-request-id`` header, else a generated one; it is sent back
    in the ``x-request-id`` trailer. An answer's notice codes are in its line; a partial
    answer (errors or degraded lanes) is logged at warning level.

    A raw exception never leaves a handler: domain errors become their gRPC status
    with ErrorInfo; anything else becomes INTERNAL / KNOWLEDGE_INTERNAL, logged with
    its type only (an exception message may quote user text).
    """

    def __init__(self, metrics: Metrics | None = None, tracing: Tracing | None = None) -> None:
        self._metrics = metrics
        self._tracing = tracing

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
        header_id = md.get("x-request-id", "")[:128] or uuid.uuid4().hex[:16]
        metrics, tracing = self._metrics, self._tracing

        def begin(context: Context, request_id: str, *, current: bool) -> _Observed:
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(
                request_id=request_id, rpc_method=method, peer=context.peer()
            )
            return _Observed(metrics, tracing, method, request_id, context, current=current)

        def bind_deadline(context: Context) -> None:
            # The caller's deadline, for the work a unary handler runs (deadline.py); it
            # runs in this call's own task, so the value is this call's alone. Operator
            # streams are not bound: their work is not the call's (it goes on, and is
            # committed, when the caller stops listening).
            left = context.time_remaining()
            REQUEST_DEADLINE.set(None if left is None else time.monotonic() + left)

        async def fail(
            context: Context, exc: BaseException, started: float, request_id: str
        ) -> None:
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
                request_id = _body_request_id(request) or header_id
                call = begin(context, request_id, current=True)
                bind_deadline(context)
                context.set_trailing_metadata((("x-request-id", request_id),))
                ok = False
                try:
                    result = await _call_unary(fn, request, context)
                    ok = True
                except (errors.KnowledgeError, Exception) as exc:
                    if _is_abort(exc, context):
                        raise
                    await fail(context, exc, call.started, request_id)
                    raise AssertionError("unreachable") from exc  # pragma: no cover
                finally:
                    call.finish(ok)
                _log_ok(result, call.started)
                return result

            return run

        def stream(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> AsyncIterator[Any]:
                call = begin(context, header_id, current=False)
                sent = 0
                ok = False
                try:
                    async for item in fn(request, context):
                        sent += 1
                        call.item(item)
                        yield item
                    ok = True
                except (errors.KnowledgeError, Exception) as exc:
                    if _is_abort(exc, context):
                        raise
                    await fail(context, exc, call.started, header_id)
                finally:
                    call.finish(ok, sent)
                log.info("rpc.ok", ms=_ms(call.started), messages=sent)

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
            return refusing_handler(handler, policy.refusal(principal, method))
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
                    # A stream its caller cancelled may be closed later by the event loop's
                    # finaliser, in a context of its own where the token means nothing.
                    with contextlib.suppress(ValueError):
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

    def __init__(
        self,
        edition: Callable[[], EditionState],
        on_refusal: Callable[[str, str], None] | None = None,
    ) -> None:
        self._edition = edition
        # Told (feature, method) of each call it refuses (the metrics' edition refusals):
        # an authenticated caller holding the method's right, as on the HTTP face.
        self._on_refusal = on_refusal

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
        refused = edition_refusal(policy, method, self._edition())
        if refused is None:
            return handler
        err, refusal = refused
        # Counted when the refusal runs, not here: the authentication interceptor is
        # outside this one and puts its own refusal (no or a bad token, a role without
        # the right) in place of this handler, and such a call is no edition refusal.
        on_refusal = self._on_refusal
        feature = policy.feature
        return refusing_handler(
            handler,
            err,
            [refusal],
            None if on_refusal is None else lambda: on_refusal(feature, method),
        )


def edition_refusal(
    policy: Policy, method: str, state: EditionState
) -> tuple[errors.EditionRequired, errors_pb2.EditionRefusal] | None:
    """The refusal of ``method`` when the edition ``state`` lacks the feature its policy
    declares, else None; the same on every face (gRPC, HTTP)."""
    if not policy.feature or policy.feature in state.features:
        return None
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
    return err, refusal


_KB_SERVICE = kb_retrieve_pb2.DESCRIPTOR.services_by_name["KnowledgeBaseService"].full_name
# Methods every refusal of which carries the call's trace id (docs/kb-retrieve.md): a
# request over a declared limit is refused here, before the call makes its trace id.
TRACED_METHODS = frozenset({f"/{_KB_SERVICE}/Retrieve", f"/{_KB_SERVICE}/Answer"})


def _limits(request: Any, context: Context) -> None:
    check_limits(request)


def _traced_limits(request: Any, context: Context) -> None:
    """``check_limits``, its refusal given the trace id the call would have: the caller's
    ``x-trace-id`` when it is a valid one, else a new one."""
    try:
        check_limits(request)
    except errors.KnowledgeError as exc:
        sent = next((v for k, v in context.invocation_metadata() or () if k == "x-trace-id"), None)
        exc.metadata["trace_id"] = trace_id = valid_trace_id(
            sent if isinstance(sent, str) else None
        )
        # As the knowledge base's own refusals are logged: the trace id a caller holds
        # finds the call in the log (the field, never the text).
        log.info(
            "kb.request_refused",
            trace_id=trace_id,
            reason=exc.reason,
            field=exc.metadata.get("field", ""),
        )
        raise


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
        traced = handler_call_details.method in TRACED_METHODS
        limits = _traced_limits if traced else _limits

        def unary(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> Any:
                limits(request, context)
                return await _call_unary(fn, request, context)

            return run

        def stream(fn: Behavior) -> Behavior:
            async def run(request: Any, context: Context) -> AsyncIterator[Any]:
                limits(request, context)
                async for item in fn(request, context):
                    yield item

            return run

        return _rewrap(handler, unary, stream)
