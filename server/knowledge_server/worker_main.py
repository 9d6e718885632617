"""The entry point of an extra serving process (setting ``workers``; see ``workers.py``).

Kept apart from ``workers.py``: a worker builds and serves a whole app, so this module
depends on the runtime and the server, while the server only needs ``WorkerGroup``. The
CLI passes :func:`run_worker` to the server as the target of the processes it starts."""

from __future__ import annotations

import asyncio
import os
import signal
from multiprocessing.connection import Connection

from knowledge_server.app import KnowledgeApp
from knowledge_server.config import Config, ConfigError
from knowledge_server.logs import configure_logging, get_logger
from knowledge_server.runtime import build_app, build_authenticator, start_background
from knowledge_server.server import serve

log = get_logger("knowledge.workers")


class _ReadySignal:
    """The worker's stand-in for stdout: the 'listening on' line becomes a message to
    the first process (only the first process prints the address)."""

    def __init__(self, writer: Connection) -> None:
        self._writer = writer

    def write(self, text: str) -> int:
        if text.startswith("listening on ") and not self._writer.closed:
            self._writer.send("ok")
            self._writer.close()
        return len(text)

    def flush(self) -> None:
        pass


async def _orphan_watch(parent_pid: int) -> None:
    while True:
        await asyncio.sleep(1.0)
        if os.getppid() != parent_pid:
            log.warning("worker.orphaned", parent_pid=parent_pid)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def run_worker(config: Config, parent_pid: int, writer: Connection, index: int) -> None:
    """Serve ``config`` in this process until SIGTERM; report readiness on ``writer``."""
    configure_logging(config.log_format, config.log_level)
    try:
        app = build_app(config)
        authenticate = build_authenticator(config)
    except ConfigError as exc:
        writer.send(f"configuration: {exc}")
        raise SystemExit(2) from None

    async def background(app: KnowledgeApp) -> None:
        await asyncio.gather(start_background(app), _orphan_watch(parent_pid))

    try:
        asyncio.run(
            serve(
                config,
                app=app,
                authenticate=authenticate,
                out=_ReadySignal(writer),
                on_started=background,
            )
        )
    except KeyboardInterrupt:
        pass
