"""The HTTP face of ``KnowledgeBaseService`` (seed 002): ``POST /knowledge/retrieve`` and
``POST /knowledge/answer``, served by the gRPC server's own process when
``retrieve_http_listen`` is set (docs/kb-retrieve.md, "HTTP face").

One schema, two faces: a request body is parsed with ``json_format`` into the same
``RetrieveRequest`` / ``AnswerRequest`` the gRPC service takes (the seed's camelCase
names; a field the message does not have is refused), checked against the proto's
declared size limits (``transport/rules.py``), answered by the same application call
(``KnowledgeApp.kb_retrieve`` / ``kb_answer``) and printed with the proto field names
(the seed's snake_case), every field included (``sources: []``, ``answerable: false``).

Authentication and the capability check are the gRPC server's: the same authenticator
(token store), and the method's policy from the proto's ``(knowledge.v1.policy)`` option
(``transport/policy.py``). With authentication off (loopback) the local principal calls,
as on gRPC. The caller's ``X-Trace-Id`` goes to the application (checked or replaced
there) and comes back in the ``X-Trace-Id`` response header and in every body, errors
included.

Errors are ``{"error": {"code": REASON, "message": ..., "trace_id": ..., "metadata":
{...}}}`` with the HTTP status of the gRPC code (google.rpc.Code's mapping: 400, 401,
403, 503 ...). Logs carry the method, status, reason, trace id and timings: never the
question, a tag code or any other text of the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog
import uvicorn
from google.protobuf import json_format
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from knowledge_server import errors
from knowledge_server._gen.knowledge.v1 import kb_retrieve_pb2 as pb
from knowledge_server.app import KnowledgeApp
from knowledge_server.auth_model import LOCAL_PRINCIPAL, Principal
from knowledge_server.config import ConfigError, parse_listen
from knowledge_server.kb.retrieve import valid_trace_id
from knowledge_server.logs import get_logger
from knowledge_server.metrics import Metrics
from knowledge_server.tracing import Tracing
from knowledge_server.transport.interceptors import edition_refusal
from knowledge_server.transport.policy import POLICIES, Policy
from knowledge_server.transport.rules import check_limits

__all__ = ["MAX_BODY_BYTES", "RetrieveHttp", "http_status", "make_asgi"]

log = get_logger("knowledge.http")

# Request bodies above this are refused (413) before they are parsed: the largest
# request the proto's limits allow (a 4000-character question, 2 x 32 tag codes of 64
# characters) is far below it.
MAX_BODY_BYTES = 64 * 1024
# A request's body must have arrived this many seconds after its head (else 408): far
# longer than any caller needs for ``MAX_BODY_BYTES``, short enough that a caller sending
# it a byte at a time does not hold a connection and a handler for long past the call's
# own budget.
BODY_READ_TIMEOUT_S = 10.0
# No cap on open connections: uvicorn bounds no request head's read time (its keep-alive
# timer runs only between requests), and its cap counts connections that never sent a
# head, so a few hundred idle sockets would make every real request 503. A head's read
# time is bounded in front of the face (docs/kb-retrieve.md).
# Seconds an idle kept-alive connection stays open after an answer.
KEEP_ALIVE_S = 5

_SERVICE = pb.DESCRIPTOR.services_by_name["KnowledgeBaseService"].full_name

# The HTTP status of each gRPC code (google.rpc.Code's documented HTTP mapping).
_HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}


def http_status(err: errors.KnowledgeError) -> int:
    """The HTTP status answering ``err``."""
    return _HTTP_STATUS.get(err.code, 500)


class _BodyTooLarge(errors.InvalidRequest):
    """A request body over ``MAX_BODY_BYTES`` (413)."""


class _BodyTooSlow(errors.InvalidRequest):
    """A request body not arrived within ``BODY_READ_TIMEOUT_S`` of its head (408)."""


@dataclass(frozen=True)
class _Endpoint:
    path: str
    method: str  # the gRPC method: its policy is this endpoint's
    request: type[Message]
    call: Callable[[KnowledgeApp, Any, Principal, str], Awaitable[Message]]

    @property
    def policy(self) -> Policy:
        return POLICIES.get(self.method, Policy())


def _retrieve(app: KnowledgeApp, req: Any, principal: Principal, tid: str) -> Awaitable[Message]:
    return app.kb_retrieve(req, principal, tid)


def _answer(app: KnowledgeApp, req: Any, principal: Principal, tid: str) -> Awaitable[Message]:
    return app.kb_answer(req, principal, tid)


ENDPOINTS = (
    _Endpoint("/knowledge/retrieve", f"/{_SERVICE}/Retrieve", pb.RetrieveRequest, _retrieve),
    _Endpoint("/knowledge/answer", f"/{_SERVICE}/Answer", pb.AnswerRequest, _answer),
)

_PARSE_FIELD = re.compile(r"Failed to parse (\w+) field")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise errors.InvalidRequest(
                f"request: field {_shown(key)} appears twice", metadata={"field": _shown(key)}
            )
        out[key] = value
    return out


def _shown(name: str) -> str:
    """A field name of the caller's, fit for a message: printable, at most 64 characters."""
    text = name[:64]
    return text if text.isprintable() else repr(text)[1:-1][:64]


def parse_request(body: bytes, cls: type[Message]) -> Message:
    """``body`` (JSON) as a ``cls`` message; InvalidRequest naming the field otherwise.
    The messages never quote a value of the body."""
    # Only UTF-8 is JSON here (RFC 8259): ``json.loads`` would also take UTF-16 and
    # UTF-32 bytes, a body a gateway in front may have read otherwise. A NUL byte is in
    # no JSON text: UTF-16 or UTF-32 without a byte order mark decodes as UTF-8 with them.
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = "\x00"
    if "\x00" in text:
        raise errors.InvalidRequest(
            "request: the body is not UTF-8 JSON", metadata={"field": "request"}
        )
    try:
        data = json.loads(text.removeprefix("\ufeff"), object_pairs_hook=_no_duplicates)
    except errors.InvalidRequest:
        raise
    except (ValueError, RecursionError):
        raise errors.InvalidRequest(
            "request: the body is not valid JSON", metadata={"field": "request"}
        ) from None
    if not isinstance(data, dict):
        raise errors.InvalidRequest(
            "request: the body must be a JSON object", metadata={"field": "request"}
        )
    fields = cls.DESCRIPTOR.fields
    known = {f.json_name for f in fields} | {f.name for f in fields}
    for key in data:
        if key not in known:
            names = ", ".join(f.json_name for f in fields)
            raise errors.InvalidRequest(
                f"request: unknown field {_shown(key)!r}; the fields are {names}",
                metadata={"field": _shown(key)},
            )
    # A field under both of its names is a key written twice: the later one would win
    # silently, over the value a gateway in front checked.
    for f in fields:
        if f.json_name != f.name and f.json_name in data and f.name in data:
            raise errors.InvalidRequest(
                f"request: field {f.json_name} appears twice (as {f.json_name} and {f.name})",
                metadata={"field": f.json_name},
            )
    try:
        return json_format.ParseDict(data, cls())
    except json_format.ParseError as exc:
        found = _PARSE_FIELD.search(str(exc))
        name = found.group(1) if found and found.group(1) in known else ""
        if name:
            raise errors.InvalidRequest(
                f"request: field {name!r} has a value of the wrong type or out of range",
                metadata={"field": name},
            ) from None
        raise errors.InvalidRequest(
            "request: a field has a value of the wrong type", metadata={"field": "request"}
        ) from None


def _json_content(request: Request) -> bool:
    value = request.headers.get("content-type", "")
    media, _, params = value.partition(";")
    if media.strip().lower() != "application/json":
        return False
    for param in params.split(";"):
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset" and val.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


# The status counted for a caller that left before its request was read (nginx's 499).
CLIENT_GONE = 499


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge(f"request: the body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            # From the receive channel, not ``request.stream()``: whether the body has all
            # arrived is known here (``_ended``), so a refusal does not wait for more.
            request.state.body_asked = True
            while True:
                message = await request.receive()
                if message.get("type") == "http.disconnect":
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                if not message.get("more_body", False):
                    request.state.body_ended = True
                size += len(chunk)
                if size > limit:
                    raise _BodyTooLarge(f"request: the body is larger than {limit} bytes")
                chunks.append(chunk)
                if getattr(request.state, "body_ended", False):
                    break
    except TimeoutError:
        raise _BodyTooSlow(
            f"request: the body did not arrive within {timeout_s:g} seconds of the head",
            metadata={"field": "request"},
        ) from None
    return b"".join(chunks)


# A refusal sent before its body was read (a missing token, a body declared too large, a
# slow one) closes its connection; the rest of the body, up to this much and for this
# long, is read and dropped first, so the caller, still sending, reads the answer instead
# of a reset connection. A larger or slower rest is not waited for.
DRAIN_BYTES = 1 << 20
DRAIN_S = 2.0


async def _drain(request: Request) -> None:
    """Read and drop what is left of ``request``'s body, within ``DRAIN_BYTES`` and
    ``DRAIN_S`` (from the ASGI receive channel: the body stream may be half read). Nothing
    when the body has all arrived, or was never asked for from a caller waiting for
    ``100 Continue`` (reading would invite the body a refusal does not want)."""
    if getattr(request.state, "body_ended", False):
        return
    waits = request.headers.get("expect", "").lower() == "100-continue"
    if waits and not getattr(request.state, "body_asked", False):
        return
    size = 0
    try:
        async with asyncio.timeout(DRAIN_S):
            while True:
                message = await request.receive()
                if message.get("type") != "http.request":
                    return
                size += len(message.get("body", b""))
                if not message.get("more_body", False) or size > DRAIN_BYTES:
                    return
    except (TimeoutError, ClientDisconnect, RuntimeError):
        return


def _error_response(err: errors.KnowledgeError, tid: str) -> JSONResponse:
    if isinstance(err, _BodyTooLarge):
        status = 413
    elif isinstance(err, _BodyTooSlow):
        status = 408
    else:
        status = http_status(err)
    body = {
        "error": {
            "code": err.reason,
            "message": err.message,
            "trace_id": tid,
            # As the gRPC error's ErrorInfo metadata (a 503's dependency, cause, trace_id).
            "metadata": dict(err.metadata),
        }
    }
    headers = {"X-Trace-Id": tid}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    # The connection goes with every refusal: most are sent before the body was read
    # (a missing token, a body declared too large, a slow one), and kept alive, a caller
    # still sending a byte now and then would hold it (each byte restarts the keep-alive
    # timer), without a token.
    headers["Connection"] = "close"
    return JSONResponse(body, status_code=status, headers=headers)


def _print(message: Message) -> dict[str, Any]:
    """``message`` as JSON with the proto field names, every field printed; the fields
    in the proto's order."""
    out = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return {f.name: out[f.name] for f in message.DESCRIPTOR.fields if f.name in out}


@contextlib.contextmanager
def _request_context(endpoint: _Endpoint, request: Request, tid: str) -> Iterator[None]:
    """The call's log context, like the gRPC server's (request id, method, peer)."""
    client = request.client
    peer = f"http:{client.host}:{client.port}" if client else "http"
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=tid, rpc_method=endpoint.method, peer=peer)
    try:
        yield
    finally:
        structlog.contextvars.clear_contextvars()


def _admit(
    app: KnowledgeApp,
    endpoint: _Endpoint,
    request: Request,
    principal: Principal,
    metrics: Metrics | None,
) -> None:
    """The gRPC method's policy and edition, and a JSON body, or the error refusing it."""
    policy = endpoint.policy
    if not policy.allows(principal):
        raise policy.refusal(principal, endpoint.method)
    refused = edition_refusal(policy, endpoint.method, app.licence.edition())
    if refused is not None:
        if metrics is not None:
            metrics.refused_edition(policy.feature, endpoint.method)
        raise refused[0]
    if not _json_content(request):
        raise errors.InvalidRequest(
            "request: the content type must be application/json (UTF-8)",
            metadata={"field": "content-type"},
        )


@contextlib.contextmanager
def _span(tracing: Tracing | None, path: str, tid: str) -> Iterator[list[int]]:
    """The call's span (with tracing on); the caller puts the answer's status in the
    list it gets (500 stays when no answer came: the call was cancelled)."""
    status = [500]
    if tracing is None:
        yield status
        return
    span, token = tracing.start_http(path, tid)
    try:
        yield status
    finally:
        tracing.end_http(span, token, status[0])


def make_asgi(
    app: KnowledgeApp,
    authenticate: Callable[[str], Principal | None] | None,
    *,
    local: Principal = LOCAL_PRINCIPAL,
    max_body: int = MAX_BODY_BYTES,
    body_timeout_s: float | None = None,
    metrics: Metrics | None = None,
    tracing: Tracing | None = None,
) -> Starlette:
    """The Starlette application of the HTTP face. ``authenticate`` None: authentication
    is off and every call runs as ``local`` (the gRPC server's rule). ``body_timeout_s``:
    how long a body may take after its head (None: ``BODY_READ_TIMEOUT_S``). ``metrics``: every
    answer is counted there by path and status, and edition refusals as on gRPC.
    ``tracing``: every call to a served path is a server span (the trace id as its
    request id; never a value of the body), the parent of the call's own spans."""

    if body_timeout_s is None:
        body_timeout_s = BODY_READ_TIMEOUT_S

    def counted(path: str, response: Response, started: float) -> Response:
        if metrics is not None:
            metrics.http(path, response.status_code, time.perf_counter() - started)
        return response

    def principal_of(request: Request) -> Principal:
        if authenticate is None:
            return local
        # Exactly one Authorization header, as on gRPC: with two, which one a proxy or a
        # server reads differs, so a request carrying two is refused, not guessed at.
        headers = request.headers.getlist("authorization")
        header = headers[0] if len(headers) == 1 else ""
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        principal = authenticate(token) if token else None
        if principal is None:
            raise errors.Unauthenticated("missing or invalid bearer token")
        return principal

    def handler(endpoint: _Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request, tid: str, started: float) -> Response:
            with _request_context(endpoint, request, tid):
                body_read = False
                try:
                    principal = principal_of(request)
                    structlog.contextvars.bind_contextvars(principal=principal.id)
                    _admit(app, endpoint, request, principal, metrics)
                    body = await _read_body(request, max_body, body_timeout_s)
                    body_read = True
                    req = parse_request(body, endpoint.request)
                    try:
                        check_limits(req)
                    except errors.KnowledgeError as exc:
                        # The call's refusals carry its trace id, this one too.
                        exc.metadata["trace_id"] = tid
                        raise
                    out = await endpoint.call(app, req, principal, tid)
                except errors.KnowledgeError as exc:
                    response = _error_response(exc, tid)
                    if not body_read:
                        await _drain(request)  # the connection closes with the answer
                    log.info(
                        "http.error",
                        status=response.status_code,
                        reason=exc.reason,
                        ms=_ms(started),
                    )
                    return response
                except ClientDisconnect:
                    # The caller left before its body arrived: nothing to answer, and not
                    # the server's error (counted as 499, the status proxies use for it).
                    log.info("http.client_gone", ms=_ms(started))
                    return Response(status_code=CLIENT_GONE)
                except Exception as exc:  # noqa: BLE001 - answered 500, type logged
                    # An exception's text may quote the request: its type alone is logged.
                    log.error("http.internal_error", error_type=type(exc).__name__, ms=_ms(started))
                    return _error_response(
                        errors.InternalError("internal error; see the server log for trace " + tid),
                        tid,
                    )
                log.info("http.ok", status=200, ms=_ms(started))
                return JSONResponse(_print(out), headers={"X-Trace-Id": tid})

        async def run(request: Request) -> Response:
            started = time.perf_counter()
            tid = valid_trace_id(request.headers.get("x-trace-id"))
            with _span(tracing, endpoint.path, tid) as status:
                response = await answer(request, tid, started)
                status[0] = response.status_code
            return counted(endpoint.path, response, started)

        return run

    routes = [Route(e.path, handler(e), methods=["POST"]) for e in ENDPOINTS]
    face = Starlette(routes=routes, exception_handlers={HTTPException: _not_served(counted)})
    # "/knowledge/retrieve/" is another path (404), not a redirect to be followed with the
    # body and the token again.
    face.router.redirect_slashes = False
    return face


def _not_served(
    counted: Callable[[str, Response, float], Response],
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """The answer to paths and methods the face does not serve: a JSON error too,
    counted under its path when it is one the face serves (a GET), else "other"."""
    served = {e.path for e in ENDPOINTS}

    async def not_served(request: Request, exc: Exception) -> Response:
        """Paths and methods the face does not serve, as JSON errors too."""
        started = time.perf_counter()
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        tid = valid_trace_id(request.headers.get("x-trace-id"))
        reason = "KNOWLEDGE_NOT_FOUND" if status == 404 else "KNOWLEDGE_INVALID_REQUEST"
        if status == 405:
            message = "only POST is served here"
        elif status == 404:
            message = "not found; the paths are /knowledge/retrieve and /knowledge/answer"
        else:
            message = "request refused"
        body = {"error": {"code": reason, "message": message, "trace_id": tid, "metadata": {}}}
        # Closed with the answer, as every refusal (``_error_response``).
        headers = {"X-Trace-Id": tid, "Connection": "close"}
        if status == 405:
            headers["Allow"] = "POST"
        path = request.url.path if request.url.path in served else "other"
        await _drain(request)
        return counted(path, JSONResponse(body, status_code=status, headers=headers), started)

    return not_served


class _Embedded(uvicorn.Server):
    """uvicorn inside the serving process's event loop: the process's signals stay the
    serving loop's (``server.serve``), which stops this face with the gRPC server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(listen: str) -> socket.socket:
    host, port = parse_listen(listen)
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family = infos[0][0]
        sock = socket.create_server((name, port), family=family, backlog=128)
    except OSError as exc:
        raise ConfigError(f"retrieve_http_listen: cannot listen on {listen}: {exc}") from None
    sock.setblocking(False)
    return sock


class RetrieveHttp:
    """The HTTP face bound to its socket (``retrieve_http_listen``; port 0 picks a free
    port: ``port`` is the bound one), served by ``start`` as a task of the running event
    loop until ``stop``. With ``tls_cert`` / ``tls_key`` it serves HTTPS (and with
    ``tls_client_ca`` asks for client certificates), like the gRPC server."""

    def __init__(
        self,
        app: KnowledgeApp,
        authenticate: Callable[[str], Principal | None] | None,
        listen: str,
        *,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        tls_client_ca: Path | None = None,
        max_body: int = MAX_BODY_BYTES,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._sock = _bind(listen)
        address = self._sock.getsockname()
        self.host = parse_listen(listen)[0]
        self.port = int(address[1])
        tls: dict[str, Any] = {}
        if tls_cert and tls_key:
            tls = {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)}
            if tls_client_ca:
                tls.update(ssl_ca_certs=str(tls_client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
        self.scheme = "https" if tls else "http"
        config = uvicorn.Config(
            make_asgi(app, authenticate, max_body=max_body, metrics=metrics, tracing=tracing),
            # An idle kept-alive connection is closed after ``KEEP_ALIVE_S``.
            timeout_keep_alive=KEEP_ALIVE_S,
            lifespan="off",
            ws="none",
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
            proxy_headers=False,
            **tls,
        )
        self._server = _Embedded(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Serve; returns once the socket accepts requests."""
        if self._task is not None:
            return
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._task.done():
                exc = None if self._task.cancelled() else self._task.exception()
                why = f": {exc}" if exc is not None and str(exc) else ""
                raise ConfigError(f"retrieve_http_listen: could not serve on {self.address}{why}")
            await asyncio.sleep(0.01)

    async def stop(self, grace: float) -> None:
        """Stop accepting requests; the ones in flight get ``grace`` seconds."""
        if self._task is None or self._task.done():
            if self._task is not None and not self._task.cancelled():
                self._task.exception()  # reported by start already
            self._sock.close()
            return
        self._server.config.timeout_graceful_shutdown = max(0, math.ceil(grace))
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
