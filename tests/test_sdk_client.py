"""The SDK's clients against a scripted gRPC server: retries come from the channel's
service config, an unreachable address fails fast, and every status code the server can
send arrives as its own typed error (with the rich details read from the trailer)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from knowledge_sdk import AsyncKnowledgeClient, KnowledgeClient, errors
from knowledge_sdk import types as v1
from knowledge_sdk.client import RPC_METHODS
from knowledge_server._gen.knowledge.v1 import errors_pb2
from knowledge_server.transport.policy import service_methods

CODES = [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]


@dataclass
class Script:
    """What the scripted server answers: ``fail`` statuses first, then a success."""

    fail: list[grpc.Status] = field(default_factory=list)
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_failure(self) -> grpc.Status | None:
        with self.lock:
            self.calls += 1
            return self.fail.pop(0) if self.fail else None


def _status(
    code: grpc.StatusCode, message: str = "scripted", details: list[Any] | None = None
) -> grpc.Status:
    packed = []
    for msg in details or []:
        item = any_pb2.Any()
        item.Pack(msg)
        packed.append(item)
    return rpc_status.to_status(
        status_pb2.Status(code=code.value[0], message=message, details=packed)
    )


@pytest.fixture
def scripted() -> Iterator[tuple[str, Script]]:
    script = Script()

    def get_status(request: bytes, context: grpc.ServicerContext) -> bytes:
        failure = script.next_failure()
        if failure is not None:
            context.abort_with_status(failure)
        return bytes(v1.GetStatusResponse(version="scripted"))

    def index_workspace(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        failure = script.next_failure()
        if failure is not None:
            context.abort_with_status(failure)
        yield bytes(v1.IndexWorkspaceResponse(progress=v1.Progress(phase="done")))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "knowledge.v1.IndexService",
                {
                    "GetStatus": grpc.unary_unary_rpc_method_handler(get_status),
                    "IndexWorkspace": grpc.unary_stream_rpc_method_handler(index_workspace),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", script
    finally:
        server.stop(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_rpc_table_names_every_method_once() -> None:
    declared = sum(len(m) for m in service_methods().values())
    assert len(set(RPC_METHODS.values())) == len(RPC_METHODS) == declared


def test_unavailable_is_retried_by_the_channel(scripted: tuple[str, Script]) -> None:
    address, script = scripted
    script.fail = [_status(grpc.StatusCode.UNAVAILABLE)] * 2
    with KnowledgeClient(address, timeout=10) as kc:
        assert kc.get_status().version == "scripted"
    assert script.calls == 3


async def test_async_unavailable_is_retried_by_the_channel(scripted: tuple[str, Script]) -> None:
    address, script = scripted
    script.fail = [_status(grpc.StatusCode.UNAVAILABLE)] * 2
    async with AsyncKnowledgeClient(address, timeout=10) as kc:
        assert (await kc.get_status()).version == "scripted"
    assert script.calls == 3


def test_retries_are_bounded(scripted: tuple[str, Script]) -> None:
    address, script = scripted
    script.fail = [_status(grpc.StatusCode.UNAVAILABLE, "down")] * 10
    started = time.monotonic()
    with KnowledgeClient(address, timeout=10) as kc, pytest.raises(errors.Unavailable) as info:
        kc.get_status()
    assert time.monotonic() - started < 2.0
    assert script.calls == 3
    # The server answered (with details): the message is its own, not "cannot reach".
    assert info.value.message == "down"


def test_other_codes_and_streams_are_not_retried(scripted: tuple[str, Script]) -> None:
    address, script = scripted
    script.fail = [_status(grpc.StatusCode.INTERNAL)]
    with KnowledgeClient(address, timeout=10) as kc:
        with pytest.raises(errors.InternalError):
            kc.get_status()
        assert script.calls == 1
        script.fail = [_status(grpc.StatusCode.UNAVAILABLE)]
        with pytest.raises(errors.Unavailable):
            list(kc.index_workspace("/ws"))
        assert script.calls == 2
        assert [p.progress.phase for p in kc.index_workspace("/ws") if p.progress] == ["done"]


@pytest.mark.parametrize("where", ["refused", "unresolvable"])
def test_unreachable_fails_fast_with_the_address(where: str) -> None:
    address = f"127.0.0.1:{_free_port()}" if where == "refused" else "no-such-host.invalid:50151"
    started = time.monotonic()
    with KnowledgeClient(address, timeout=30) as kc, pytest.raises(errors.Unavailable) as info:
        kc.get_status()
    assert time.monotonic() - started < 2.0
    assert address in str(info.value) and info.value.reason == ""


@pytest.mark.parametrize("where", ["refused", "unresolvable"])
async def test_async_unreachable_fails_fast_with_the_address(where: str) -> None:
    address = f"127.0.0.1:{_free_port()}" if where == "refused" else "no-such-host.invalid:50151"
    started = time.monotonic()
    async with AsyncKnowledgeClient(address, timeout=30) as kc:
        with pytest.raises(errors.Unavailable) as info:
            await kc.search("anything")
        with pytest.raises(errors.Unavailable):
            async for _ in kc.rebuild_derived():
                pass
    assert time.monotonic() - started < 4.0  # two calls
    assert address in str(info.value)


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
def test_every_status_code_has_its_error_class(
    scripted: tuple[str, Script], code: grpc.StatusCode
) -> None:
    address, script = scripted
    info = error_details_pb2.ErrorInfo(
        reason=f"KNOWLEDGE_{code.name}", domain="knowledge.v1", metadata={"k": "v"}
    )
    script.fail = [_status(code, "why", [info])] * 4
    with KnowledgeClient(address, timeout=10) as kc, pytest.raises(errors.RPCError) as raised:
        kc.get_status()
    err = raised.value
    assert type(err) is errors.BY_CODE[code] and type(err).status is code
    assert isinstance(err, errors.KnowledgeError)
    assert (err.code, err.message, err.reason, err.metadata) == (
        code,
        "why",
        f"KNOWLEDGE_{code.name}",
        {"k": "v"},
    )


def test_the_error_classes_cover_every_code_once() -> None:
    assert set(errors.BY_CODE) == set(CODES)
    assert len(set(errors.BY_CODE.values())) == len(CODES)
    assert errors.FailedPrecondition.status is grpc.StatusCode.FAILED_PRECONDITION


async def test_edition_refusal_detail_is_edition_refused(scripted: tuple[str, Script]) -> None:
    address, script = scripted
    refusal = errors_pb2.EditionRefusal(
        feature="doc-graph",
        required_edition="enterprise",
        current_edition="community",
        licence_state="none",
        message="needs enterprise",
    )
    info = error_details_pb2.ErrorInfo(reason="KNOWLEDGE_EDITION_REQUIRED", domain="knowledge.v1")
    script.fail = [_status(grpc.StatusCode.PERMISSION_DENIED, "denied", [info, refusal])]
    async with AsyncKnowledgeClient(address, timeout=10) as kc:
        with pytest.raises(errors.EditionRefused) as raised:
            await kc.get_status()
    err = raised.value
    assert isinstance(err, errors.PermissionDenied)
    assert (err.reason, err.feature, err.required_edition, str(err)) == (
        "KNOWLEDGE_EDITION_REQUIRED",
        "doc-graph",
        "enterprise",
        "needs enterprise",
    )


def test_undecodable_details_keep_the_code() -> None:
    trailer = [("grpc-status-details-bin", b"\x0a\xff\xff")]
    err = errors.from_status(grpc.StatusCode.NOT_FOUND, "gone", trailer)
    assert type(err) is errors.NotFound and err.reason == ""
    unknown_detail = any_pb2.Any(type_url="type.googleapis.com/x.v1.Unknown", value=b"\x08\x01")
    raw = status_pb2.Status(code=5, message="gone", details=[unknown_detail]).SerializeToString()
    err = errors.from_status(grpc.StatusCode.NOT_FOUND, "gone", [("grpc-status-details-bin", raw)])
    assert type(err) is errors.NotFound and err.message == "gone"


def test_only_calls_safe_to_send_again_are_retried() -> None:
    """The SDK lets gRPC send a call again after UNAVAILABLE only when the proto marks it
    free of side effects or idempotent: a write whose answer was lost after the server did
    it (Remember, CreateTopic, CreateFeedback) was done twice. The list is the proto's."""
    import json

    from knowledge_sdk import client as sdk_client
    from knowledge_server.transport.policy import FILES

    marked = set()
    for module in FILES:  # every proto file that declares a service
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if method.GetOptions().idempotency_level in (1, 2):  # NO_SIDE_EFFECTS, IDEMPOTENT
                    marked.add(f"{service.full_name}/{method.name}")
    assert sdk_client.SAFE_TO_REPEAT == marked
    config = json.loads(sdk_client.SERVICE_CONFIG)
    retried = {
        f"{name['service']}/{name['method']}"
        for entry in config["methodConfig"]
        for name in entry["name"]
    }
    assert retried <= marked
    for write in (
        "knowledge.v1.MemoryService/Remember",
        "knowledge.v1.KnowledgeBaseAdminService/CreateTopic",
        "knowledge.v1.KnowledgeBaseAdminService/CreateFeedback",
    ):
        assert write not in retried
    assert "knowledge.v1.MemoryService/Recall" in retried


def test_connection_settings_refuse_what_would_abort_or_leak(tmp_path: Any) -> None:
    """A client certificate without its key aborted the process in gRPC's core (nothing to
    catch); a key without a certificate left the channel in plain text with the token on
    it; a token holding a line break or another character no header carries failed every
    call as INTERNAL. Each is a ConnectionConfigError when the client is made; a token
    read from a file is trimmed; the token is not in the settings' repr."""
    from knowledge_sdk.client import ConnectionSettings

    pem = tmp_path / "x.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    for kwargs in ({"tls_cert": pem}, {"tls_key": pem}):
        with pytest.raises(errors.ConnectionConfigError, match="KNOWLEDGE_TLS_CERT"):
            KnowledgeClient("127.0.0.1:1", settings=ConnectionSettings(**kwargs))
    for token in ("kn_abc\r\ndef", "kn_abc def", "kn_\u00e9t\u00e9"):
        with pytest.raises(errors.ConnectionConfigError, match="token"):
            KnowledgeClient("127.0.0.1:1", token=token)
    kc = KnowledgeClient("127.0.0.1:1", token="kn_secret_value\n")  # noqa: S106 - a test value
    try:
        assert kc.settings.token == "kn_secret_value"
        assert "kn_secret_value" not in repr(kc.settings)
    finally:
        kc.close()


async def _one_rpc_server(path: str, handler: Any) -> tuple[Any, int]:
    """A started gRPC aio server on a loopback port answering ``path`` with ``handler``
    (and nothing else); the caller stops it."""

    class One(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            return handler if details.method == path else None

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((One(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def test_the_async_client_ends_a_stream_its_caller_leaves() -> None:
    """Leaving an async stream's loop (break) ends the call on the wire, as the sync
    client does: before, the server went on streaming until the client was closed."""
    import asyncio

    from knowledge_sdk import AsyncKnowledgeClient

    state: dict[str, str] = {}

    async def watch(request: Any, context: Any) -> Any:
        state["call"] = "started"
        try:
            while True:
                yield v1.WatchTaskResponse()
                await asyncio.sleep(0.02)
        finally:  # cancelled, or closed by the loop when cancelled while it was sending
            state["call"] = "ended"

    server, port = await _one_rpc_server(
        "/knowledge.v1.KnowledgeBaseAdminService/WatchTask",
        grpc.unary_stream_rpc_method_handler(
            watch, request_deserializer=v1.WatchTaskRequest.parse, response_serializer=bytes
        ),
    )
    kc = AsyncKnowledgeClient(f"127.0.0.1:{port}")
    try:
        async for _ in kc.kb_watch_task("task-1"):
            break
        for _ in range(200):  # the generator is closed by the loop, then the call ends
            if state.get("call") == "ended":
                break
            await asyncio.sleep(0.02)
        assert state.get("call") == "ended"
    finally:
        await kc.close()
        await server.stop(0)


async def test_a_call_on_a_closed_client_is_a_knowledge_error() -> None:
    """errors.py: no raw transport exception escapes. A call on a closed client raised
    gRPC's ValueError (sync) or UsageError (async); it is ClientClosed."""
    from knowledge_sdk import AsyncKnowledgeClient

    kc = KnowledgeClient("127.0.0.1:1")
    kc.close()
    with pytest.raises(errors.ClientClosed):
        kc.get_status()
    with pytest.raises(errors.ClientClosed):
        next(iter(kc.rebuild_derived()))
    akc = AsyncKnowledgeClient("127.0.0.1:1")
    await akc.close()
    with pytest.raises(errors.ClientClosed):
        await akc.get_status()


async def test_closing_the_async_client_under_a_call_is_client_closed() -> None:
    """The async client closed while a call waits: the call ends with ClientClosed, a
    KnowledgeError, as the sync client's ends with a typed error; it surfaced as asyncio's
    CancelledError, which a caller takes for the cancelling of its own task."""
    import asyncio

    from knowledge_sdk import AsyncKnowledgeClient

    async def hang(request: Any, context: Any) -> Any:
        await asyncio.sleep(60)

    server, port = await _one_rpc_server(
        "/knowledge.v1.IndexService/GetStatus",
        grpc.unary_unary_rpc_method_handler(
            hang, request_deserializer=v1.GetStatusRequest.parse, response_serializer=bytes
        ),
    )
    kc = AsyncKnowledgeClient(f"127.0.0.1:{port}", timeout=60)
    try:
        waiting = asyncio.create_task(kc.get_status())
        await asyncio.sleep(0.5)
        await kc.close()
        with pytest.raises(errors.ClientClosed):
            await waiting
    finally:
        await server.stop(0)


def test_a_close_from_another_thread_between_check_and_call_is_client_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A close() from another thread landing between the client's open check and the
    call: gRPC's "closed channel" ValueError is ClientClosed too (4 of 300 racing calls
    leaked it). The race is made certain by closing inside the open check."""
    kc = KnowledgeClient("127.0.0.1:1")
    real = kc._check_open

    def check_then_closed_elsewhere() -> None:
        real()
        kc.close()  # as another thread would, right after the check

    monkeypatch.setattr(kc, "_check_open", check_then_closed_elsewhere)
    with pytest.raises(errors.ClientClosed):
        kc.get_status()
