"""Server factory and the serve loop.

``create_server(config)`` builds a started-but-not-serving ``grpc.aio`` server with
health checking, reflection and the interceptors, bound to ``config.listen`` (port 0
picks a free port), and with ``retrieve_http_listen`` the HTTP face of Retrieve /
Answer bound too (``kb/http.py``); ``start_served`` starts both. Tests use it on
``127.0.0.1:0``. ``serve(config)`` runs until SIGTERM/SIGINT, then shuts down
gracefully: health goes NOT_SERVING, in-flight calls get ``grace_seconds`` to finish.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from knowledge_server._gen.knowledge.v1 import (
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
)
from knowledge_server.app import KnowledgeApp
from knowledge_server.auth_model import Principal
from knowledge_server.config import Config, ConfigError, parse_listen
from knowledge_server.kb.http import RetrieveHttp
from knowledge_server.logs import get_logger
from knowledge_server.metrics import Metrics, MetricsEndpoint
from knowledge_server.tracing import Tracing, otlp_provider
from knowledge_server.transport.interceptors import (
    AuthInterceptor,
    ContextInterceptor,
    EditionInterceptor,
    LimitsInterceptor,
)
from knowledge_server.transport.servicers import (
    DocGraphServicer,
    IndexServicer,
    KnowledgeBaseAdminServicer,
    KnowledgeBaseServicer,
    KnowledgeServicer,
    MemoryServicer,
)
from knowledge_server.workers import WorkerGroup, WorkerMain

log = get_logger("knowledge.server")

SERVICE_NAMES = (
    knowledge_service_pb2.DESCRIPTOR.services_by_name["KnowledgeService"].full_name,
    docgraph_pb2.DESCRIPTOR.services_by_name["DocGraphService"].full_name,
    index_service_pb2.DESCRIPTOR.services_by_name["IndexService"].full_name,
    kb_admin_pb2.DESCRIPTOR.services_by_name["KnowledgeBaseAdminService"].full_name,
    kb_retrieve_pb2.DESCRIPTOR.services_by_name["KnowledgeBaseService"].full_name,
    memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name,
)


def _credentials(config: Config) -> grpc.ServerCredentials | None:
    if not config.tls_cert or not config.tls_key:
        return None
    key = config.tls_key.read_bytes()
    cert = config.tls_cert.read_bytes()
    root = config.tls_client_ca.read_bytes() if config.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=root, require_client_auth=root is not None
    )


@dataclass(frozen=True)
class Served:
    """A bound (not yet started) server with what it serves."""

    server: grpc.aio.Server
    port: int
    app: KnowledgeApp
    health: health.aio.HealthServicer
    metrics: Metrics | None = None
    tracing: Tracing | None = None
    metrics_endpoint: MetricsEndpoint | None = None
    # The HTTP face of Retrieve / Answer (``retrieve_http_listen``), bound, not serving yet.
    http: RetrieveHttp | None = None


def check_port_free(listen: str) -> None:
    """Raise ConfigError when another process listens on ``listen`` already.

    ``serve`` calls this before it opens anything, so a second server on a busy port stops
    with one line and leaves the running one alone. The probe binds the way gRPC does
    (``SO_REUSEADDR``, so connections of an earlier run in TIME_WAIT do not count) and
    without ``SO_REUSEPORT``, so a server that shares its port among its own workers is
    found too. Other failures (an address this host does not have, ...) are left to the
    real bind to report."""
    host, port = parse_listen(listen)
    if port == 0:
        return
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return
    for family, kind, proto, _, sockaddr in infos:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
                probe.listen(1)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ConfigError(
                        f"listen: {host}:{port} is already in use (another server is listening there)"
                    ) from None


async def create_server(
    config: Config,
    app: KnowledgeApp | None = None,
    *,
    authenticate: Callable[[str], Principal | None] | None = None,
    metrics: Metrics | None = None,
    tracing: Tracing | None = None,
) -> Served:
    """``metrics`` / ``tracing``: given (tests), else made when the configuration turns
    them on (``metrics_listen``, ``tracing_otlp_endpoint``); off, they cost nothing."""
    app = app or KnowledgeApp(config)
    if config.auth_required and authenticate is None:
        raise ConfigError(
            f"listening on {config.listen} needs authentication, but no token store is configured; "
            "create a token with `knowledge token create` or listen on 127.0.0.1"
        )
    if metrics is None and config.metrics_listen:
        metrics = Metrics()
    if tracing is None and config.tracing_otlp_endpoint:
        tracing = Tracing(otlp_provider(config.tracing_otlp_endpoint, config.tracing_sample_ratio))
    if metrics is not None:
        metrics.watch_licence(app.licence.status)
    app.coordinator.observers.extend(o for o in (metrics, tracing) if o is not None)
    interceptors = [
        ContextInterceptor(metrics, tracing),
        AuthInterceptor(authenticate if config.auth_required else None),
        EditionInterceptor(app.licence.edition, metrics.refused_edition if metrics else None),
        LimitsInterceptor(),
    ]
    server = grpc.aio.server(
        interceptors=interceptors,
        # Port sharing only between this service's own worker processes (workers > 1);
        # otherwise a port already in use is an error, not silently shared.
        options=[
            ("grpc.so_reuseport", 1 if config.workers > 1 else 0),
            ("grpc.max_receive_message_length", 8 * 1024 * 1024),
        ],
    )
    knowledge_service_pb2_grpc.add_KnowledgeServiceServicer_to_server(
        KnowledgeServicer(app), server
    )
    docgraph_pb2_grpc.add_DocGraphServiceServicer_to_server(DocGraphServicer(app), server)
    index_service_pb2_grpc.add_IndexServiceServicer_to_server(IndexServicer(app), server)
    kb_admin_pb2_grpc.add_KnowledgeBaseAdminServiceServicer_to_server(
        KnowledgeBaseAdminServicer(app), server
    )
    kb_retrieve_pb2_grpc.add_KnowledgeBaseServiceServicer_to_server(
        KnowledgeBaseServicer(app), server
    )
    memory_pb2_grpc.add_MemoryServiceServicer_to_server(MemoryServicer(app), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    host, port = parse_listen(config.listen)
    creds = _credentials(config)
    address = f"{host}:{port}"
    try:
        bound = (
            server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
        )
    except RuntimeError:
        # grpc raises a bare RuntimeError with its own advice; say what went wrong.
        bound = 0
    if bound == 0:
        check_port_free(config.listen)
        raise ConfigError(f"listen: could not bind {address}")
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    http = None
    if config.retrieve_http_listen:
        http = RetrieveHttp(
            app,
            authenticate if config.auth_required else None,
            config.retrieve_http_listen,
            tls_cert=config.tls_cert,
            tls_key=config.tls_key,
            tls_client_ca=config.tls_client_ca,
            metrics=metrics,
            tracing=tracing,
        )
    endpoint = None
    if metrics is not None and config.metrics_listen:
        try:
            endpoint = MetricsEndpoint(metrics, config.metrics_listen)
        except ConfigError:
            if http is not None:
                await http.stop(0)
            raise
    return Served(server, bound, app, health_servicer, metrics, tracing, endpoint, http)


async def start_served(served: Served) -> None:
    """Start serving: the gRPC server, then the HTTP face (when configured)."""
    await served.server.start()
    if served.http is not None:
        await served.http.start()


async def shutdown(served: Served, grace: float) -> None:
    """Health NOT_SERVING first, then stop accepting calls (in-flight ones get ``grace``
    seconds), then close the stores."""
    await served.health.enter_graceful_shutdown()
    if served.http is not None:
        await asyncio.gather(served.http.stop(grace), served.server.stop(grace))
    else:
        await served.server.stop(grace)
    await served.app.settle(grace)
    served.app.close()
    if served.metrics_endpoint is not None:
        served.metrics_endpoint.close()
    if served.tracing is not None:
        served.tracing.shutdown()


class Output(Protocol):
    """Where ``serve`` writes its ``listening on`` line (standard output, or a writer
    that also records the address)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


async def serve(
    config: Config,
    *,
    app: KnowledgeApp | None = None,
    authenticate: Callable[[str], Principal | None] | None = None,
    out: Output = sys.stdout,
    on_started: Callable[[KnowledgeApp], object] | None = None,
    worker_main: WorkerMain | None = None,
    on_stopping: Callable[[], object] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; with ``config.workers > 1`` and a ``worker_main`` (the
    entry point of a worker process, ``worker_main.run_worker``) also start and stop the
    extra serving processes (see knowledge_server.workers). ``on_stopping`` is called
    once the stop is asked, before the calls in flight get their grace and the stores
    close (work that runs on may keep the process alive after its port is given up)."""
    served = await create_server(config, app, authenticate=authenticate)
    port, app = served.port, served.app
    try:
        await start_served(served)
    except ConfigError:
        await shutdown(served, 0)
        raise
    host = parse_listen(config.listen)[0]
    log.info(
        "server.started",
        port=port,
        tls=bool(config.tls_cert),
        auth=config.auth_required,
        edition=app.licence.edition().edition,
    )
    if served.http is not None:
        log.info(
            "server.retrieve_http_started",
            url=f"{served.http.scheme}://{served.http.address}",
            paths=["/knowledge/retrieve", "/knowledge/answer"],
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    workers = WorkerGroup(config, host, port, target=worker_main)

    def on_hangup() -> None:
        app.reload()
        workers.signal(signal.SIGHUP)

    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    try:
        await workers.start()
    except ConfigError:
        await workers.stop(0)
        await shutdown(served, 0)
        if stop.is_set():
            # Asked to stop while the workers started (a Ctrl-C reaches them too): a
            # stop, not a failed start.
            log.info("server.stopped", during="start-up")
            return
        raise
    background: asyncio.Task[object] | None = None
    watch: asyncio.Task[None] | None = None
    try:
        # Printed only once every process accepts calls and signals are handled. Nobody
        # may read it (`knowledge serve | head -0`): the service serves on, found by its
        # recorded address.
        try:
            print(f"listening on {host}:{port}", file=out, flush=True)
        except OSError as exc:
            log.warning("server.listening_line_lost", error_type=type(exc).__name__, port=port)
        if on_started is not None:
            result = on_started(app)
            if asyncio.iscoroutine(result):
                background = asyncio.create_task(result)
        watch = asyncio.create_task(workers.watch(stop))
        await stop.wait()
        log.info("server.stopping", grace_seconds=config.grace_seconds)
        if on_stopping is not None:
            on_stopping()
    finally:
        # However serving ended (a failure here too): the workers stop with this process,
        # which otherwise waited for them forever.
        if watch is not None:
            watch.cancel()
        if background is not None:
            background.cancel()
        await asyncio.gather(
            workers.stop(config.grace_seconds), shutdown(served, config.grace_seconds)
        )
    log.info("server.stopped")
