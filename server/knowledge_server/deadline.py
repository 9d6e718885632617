"""The caller's deadline, and blocking request work run off the event loop within it.

A gRPC client may give its call a deadline. The transport puts the instant it passes
(``time.monotonic()``) in ``REQUEST_DEADLINE`` for the handler; from then on:

- ``off_loop(fn, ..., pool=...)`` runs blocking work (SQLite reads, status counts,
  dispatch planning, document-graph operations) in a small thread pool and waits for it
  no longer than the deadline: past it the call answers ``DEADLINE_EXCEEDED`` at once, work
  still queued is never run, and work already running has its result dropped;
- reader connections (``lanes.common.bound_reader``) interrupt a query still running at
  the deadline, in a thread or on the loop, so late work stops instead of holding its
  connection and its thread.

The pools are bounded (``POOL_THREADS`` each, six pools per serving process): a flood of
requests queues, it never starts more threads. A queued call whose deadline passes before
a thread is free is dropped without running, as is one whose caller is cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import apsw

from knowledge_server.errors import DeadlineExceeded

R = TypeVar("R")

# When the current call's deadline passes (time.monotonic()); None = the caller set none.
REQUEST_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "knowledge_request_deadline", default=None
)

# Blocking request work runs in small thread pools, one per kind of work (named by the
# caller: "episodes", "code", "status", "dispatch", "docgraph", "kb"), not in asyncio's shared
# default pool: one kind's slow work (an LLM call, a slow embedding endpoint) never
# delays another's, and a flood of one kind queues behind its own threads instead of
# starting more. Each thread holds at most one reader connection per store
# (``lanes.common.READERS`` counts them).
POOL_THREADS = 2
_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str) -> concurrent.futures.ThreadPoolExecutor:
    pool = _pools.get(name)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(name)
            if pool is None:
                pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=POOL_THREADS, thread_name_prefix=f"request-{name}"
                )
                _pools[name] = pool
    return pool


MESSAGE = "the call's deadline passed before the answer was ready"


class BeganGate:
    """Whether a write run by ``off_loop`` has begun in its thread, or was abandoned by its
    caller before it could (it then never begins): exactly one side records the write's
    audit event, the thread that ran it or the caller that gave up on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._began = self._abandoned = False

    def begin(self) -> bool:
        """In the worker thread, first: True if the write may run (not abandoned)."""
        with self._lock:
            self._began = not self._abandoned
            return self._began

    def abandon(self) -> bool:
        """On the caller's error: True (and the write never begins) if it had not begun."""
        with self._lock:
            self._abandoned = not self._began
            return self._abandoned


def remaining() -> float | None:
    """Seconds left before the current call's deadline (may be negative); None = none."""
    deadline = REQUEST_DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


def passed() -> bool:
    left = remaining()
    return left is not None and left <= 0


def check() -> None:
    """Raise ``DeadlineExceeded`` when the current call's deadline has passed."""
    if passed():
        raise DeadlineExceeded(MESSAGE)


@contextmanager
def within(seconds: float | None) -> Iterator[None]:
    """The code inside runs under a deadline ``seconds`` from now (None: no deadline of
    its own); an earlier deadline already set stays."""
    deadline = REQUEST_DEADLINE.get()
    if seconds is not None:
        mine = time.monotonic() + seconds
        deadline = mine if deadline is None else min(deadline, mine)
    token = REQUEST_DEADLINE.set(deadline)
    try:
        yield
    finally:
        REQUEST_DEADLINE.reset(token)


@contextmanager
def interrupted_as_deadline() -> Iterator[None]:
    """A query interrupted at the call's deadline (``apsw.InterruptError``), or a busy
    database given up on there (``apsw.BusyError``), becomes ``DeadlineExceeded``; either
    for any other reason stays what it is."""
    try:
        yield
    except (apsw.InterruptError, apsw.BusyError):
        if passed():
            raise DeadlineExceeded(MESSAGE) from None
        raise


async def awaited(work: Coroutine[Any, Any, R]) -> R:
    """Await ``work`` until the call's deadline at most: what it awaits (threads, other
    servers) is cancelled there and the call answers ``DEADLINE_EXCEEDED``. What it runs
    on the loop itself cannot be cut short; it must stop at the deadline by itself, as
    reader connections do."""
    left = remaining()
    if left is None:
        return await work
    if left <= 0:
        work.close()  # never started
        raise DeadlineExceeded(MESSAGE)
    timeout = asyncio.timeout(left)
    try:
        async with timeout:
            return await work
    except TimeoutError:
        if timeout.expired():
            raise DeadlineExceeded(MESSAGE) from None
        raise


async def off_loop(fn: Callable[..., R], *args: object, pool: str) -> R:
    """Run blocking ``fn(*args)`` in the thread pool named ``pool``, within the call's
    deadline.

    The thread sees the caller's context (its deadline, its request id for the logs).
    Past the deadline this raises ``DeadlineExceeded``: still queued, the work is
    cancelled; already running, it finishes in its thread (reader queries stop at the
    deadline by themselves) and its result is dropped."""
    check()
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    future = loop.run_in_executor(_pool(pool), ctx.run, functools.partial(fn, *args))
    left = remaining()
    with interrupted_as_deadline():
        if left is None:
            return await future
        try:
            return await asyncio.wait_for(future, timeout=max(left, 0))
        except TimeoutError:
            raise DeadlineExceeded(MESSAGE) from None
