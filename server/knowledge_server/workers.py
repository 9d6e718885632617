"""More serving processes on the same port (setting ``workers``).

A Python process answers on one core at a time (its interpreter lock), so one server
uses one of the machine's cores however many calls are in flight. With ``workers = N``
the first process, once it has bound the port, starts N-1 more; each is a complete
server on the same port (SO_REUSEPORT) with its own lanes and caches, and the kernel
spreads incoming connections over them. The stores are SQLite files shared by all:
readers never block, and every writer takes the store's cross-process lock
(:class:`knowledge_server.lanes.common.WriterLock`).

The first process alone runs the start-up work (bootstrap) and the live ingest (whose
watcher runs in a child process of its own, ``lanes/live.py``). It passes SIGHUP and
SIGTERM on, restarts a worker that dies (a few times a minute at most), and a worker
whose first process has gone stops by itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from knowledge_server.config import Config, ConfigError
from knowledge_server.logs import get_logger

__all__ = ["WorkerGroup", "WorkerMain"]

# A worker process's entry point: (config, first process's pid, ready pipe, worker index).
WorkerMain = Callable[[Config, int, Connection, int], None]

log = get_logger("knowledge.workers")

START_TIMEOUT_S = 120.0
MAX_RESTARTS_PER_MINUTE = 5


class WorkerGroup:
    """The extra processes of one serving process (none when ``workers == 1``)."""

    def __init__(
        self, config: Config, host: str, port: int, *, target: WorkerMain | None = None
    ) -> None:
        """``target`` runs in each new process (``worker_main.run_worker``); None = this
        process is itself a worker and starts no others."""
        # The metrics endpoint, the HTTP face of Retrieve / Answer and the session watcher
        # are the first process's (their ports are not shared; one watcher ingests for all).
        self.config = dataclasses.replace(
            config,
            listen=f"{host}:{port}",
            bootstrap=False,
            metrics_listen="",
            retrieve_http_listen="",
            watch_sessions=False,
        )
        self._target = target
        self.count = max(0, config.workers - 1) if target is not None else 0
        self._ctx = mp.get_context("spawn")
        self._procs: dict[int, Any] = {}
        self._restarts: list[float] = []
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.pid is not None]

    async def start(self) -> None:
        """Start every worker and wait until each accepts calls (ConfigError if one fails)."""
        started = [self._spawn(i) for i in range(1, self.count + 1)]
        for index, reader in started:
            await self._await_ready(index, reader)

    def _spawn(self, index: int) -> tuple[int, Connection]:
        reader, writer = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=self._target,
            args=(self.config, os.getpid(), writer, index),
            name=f"knowledge-worker-{index}",
        )
        proc.start()
        writer.close()
        self._procs[index] = proc
        return index, reader

    async def _await_ready(self, index: int, reader: Connection) -> None:
        proc = self._procs[index]
        message = await asyncio.to_thread(_read_ready, reader, proc, START_TIMEOUT_S)
        reader.close()
        if message != "ok":
            raise ConfigError(f"worker {index} did not start: {message}")
        log.info("worker.started", worker=index, pid=proc.pid)

    def signal(self, sig: int) -> None:
        for proc in self._procs.values():
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, sig)

    async def watch(self, stop: asyncio.Event) -> None:
        """Restart workers that die, unless they keep dying."""
        while not stop.is_set():
            await asyncio.sleep(1.0)
            for index, proc in list(self._procs.items()):
                if proc.is_alive() or self._stopping:
                    continue
                log.error("worker.exited", worker=index, pid=proc.pid, exit_code=proc.exitcode)
                now = time.monotonic()
                self._restarts = [t for t in self._restarts if now - t < 60] + [now]
                if len(self._restarts) > MAX_RESTARTS_PER_MINUTE:
                    log.error(
                        "worker.not_restarted", worker=index, reason="too many exits in a minute"
                    )
                    del self._procs[index]
                    continue
                try:
                    await self._await_ready(*self._spawn(index))
                except ConfigError as exc:
                    log.error("worker.restart_failed", worker=index, error=str(exc))

    async def stop(self, grace: float) -> None:
        """SIGTERM to every worker, then wait; a worker still running after the grace
        period (plus a margin for its own shutdown) is killed."""
        self._stopping = True
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace + 5.0
        for proc in self._procs.values():
            await asyncio.to_thread(proc.join, max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, 5.0)


def _read_ready(reader: Connection, proc: Any, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    closed = False
    while time.monotonic() < deadline:
        if reader.poll(0.2):
            try:
                return str(reader.recv())
            except EOFError:
                closed = True
                break
        if not proc.is_alive():
            break
    if closed:
        # Its end of the pipe closed: the worker is exiting (a Ctrl-C to the process group
        # during start-up); its exit code says why, not a timeout that never happened.
        proc.join(5)
    if proc.is_alive():
        if closed:
            return "closed its pipe without answering"
        return f"no answer within {timeout:.0f}s"
    return f"exited with code {proc.exitcode}"
