"""Helpers shared by lane adapters: reader pools, thread -> async progress streams."""

from __future__ import annotations

import asyncio
import fcntl
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Protocol, Self, TypeVar

import apsw
from google.protobuf import timestamp_pb2

from knowledge_server import deadline
from knowledge_server._gen.knowledge.v1 import errors_pb2, index_service_pb2
from knowledge_server.deadline import POOL_THREADS, REQUEST_DEADLINE
from knowledge_server.errors import StorageFull, as_storage_full
from knowledge_server.search.lanes import LANE_DEADLINE

T = TypeVar("T")
R = TypeVar("R")
H = TypeVar("H")


# Reader connections per store: one for the searches on the loop, one per thread of the
# request pools that read the store (``deadline.off_loop``: its own lane's, "status" and
# "dispatch"), and one for an operator stream. The loop never waits for a reader that
# threads hold.
READERS = 1 + 3 * POOL_THREADS + 1


class Pool(Generic[T]):
    """A small pool of read-only store connections, one per concurrent user (a search on
    the loop, a GetEpisode in a thread, ...)."""

    def __init__(self, factory: Callable[[], T], size: int = READERS) -> None:
        self._factory = factory
        self._free: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._size = size
        self._made = 0
        self._lock = threading.Lock()

    @contextmanager
    def get(self) -> Iterator[T]:
        try:
            item = self._free.get_nowait()
        except queue.Empty:
            with self._lock:
                make = self._made < self._size
                if make:
                    self._made += 1
            item = self._factory() if make else self._free.get()
        try:
            yield item
        finally:
            self._free.put(item)

    def close_all(self, closer: Callable[[T], None]) -> None:
        while True:
            try:
                closer(self._free.get_nowait())
            except queue.Empty:
                break


class WriterLock:
    """One writer at a time for a store, across threads and processes.

    A thread lock for this process plus ``flock`` on ``DATA_DIR/locks/<name>.lock`` for the
    other serving processes (``workers > 1``). The kernel drops the file lock when its
    holder dies, so a killed process never leaves the store locked."""

    def __init__(self, data_dir: Path | str, name: str) -> None:
        self._path = Path(data_dir) / "locks" / f"{name}.lock"
        self._thread = threading.Lock()
        self._fd = -1

    def __enter__(self) -> Self:
        self._thread.acquire()
        try:
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            self._thread.release()
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, -1
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        finally:
            self._thread.release()

    def locked(self) -> bool:
        return self._thread.locked()

    @contextmanager
    def idle(self, timeout: float) -> Iterator[bool]:
        """This process's writers only (no file lock), for closing the store once the
        writer running in this process, if any, has finished: yields whether it had
        within ``timeout`` (held until the block ends), else False (not held)."""
        got = self._thread.acquire(timeout=timeout)
        try:
            yield got
        finally:
            if got:
                self._thread.release()


def operation_summary(
    report: object, counters: Sequence[str], *, index_rev: str, changed: bool, started: float
) -> index_service_pb2.OperationSummary:
    """The summary an operator stream ends with: revision, whether anything changed, the
    time since ``started`` (``time.perf_counter``) and the named integer counters of ``report``."""
    summary = index_service_pb2.OperationSummary(
        index_rev=index_rev, changed=changed, ms=round((time.perf_counter() - started) * 1000, 1)
    )
    for key in counters:
        summary.counters[key] = int(getattr(report, key))
    return summary


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ts(value: datetime | float | None) -> timestamp_pb2.Timestamp | None:
    """A Timestamp for a datetime (naive = UTC) or POSIX seconds; the same value as
    ``Timestamp.FromDatetime``, computed with datetime arithmetic (a search converts
    about 40 of them, and FromDatetime goes through a time tuple each time)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(float(value), tz=UTC)
    elif value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    return timestamp_pb2.Timestamp(
        seconds=delta.days * 86400 + delta.seconds, nanos=delta.microseconds * 1000
    )


ProgressFn = Callable[[str, int, int, str], None]

# Our lanes answer a search on the event loop's own thread (``run_bounded``), not in a
# thread pool. Their work is short SQLite reads with a little Python around them, and a
# thread per lane call cost more than it saved: apsw releases the GIL on every step of a
# query, so two threads (or the loop and one thread) hand the GIL to each other many times
# per search, and every hop is a future, a wake-up and a context switch. The lanes of one
# search therefore run one after the other; a single client loses the little their
# overlap on a second core gave it, and stays well within its latency target (figures in
# bench/RESULTS.md).
#
# What a thread gave for free, ``bound_reader`` gives back: a reader connection stops a
# query at the lane's deadline (``LANE_DEADLINE``, set by the coordinator) instead of
# holding the loop, and waits for a busy database no longer than that either. Every other
# reader use (GetEpisode, GetChunk, GetStatus, dispatch planning, document-graph
# operations) runs in a thread (``deadline.off_loop``), within the caller's deadline.

# SQLite virtual-machine steps between two deadline checks: some tens of microseconds of
# query work, beside which the check itself costs next to nothing.
PROGRESS_STEPS = 10_000


class LaneDeadlineExceeded(TimeoutError):
    """A lane's query was stopped at its deadline."""


def _deadline() -> float | None:
    """The earlier of the current lane call's deadline and the caller's own."""
    lane, request = LANE_DEADLINE.get(), REQUEST_DEADLINE.get()
    if lane is None or request is None:
        return lane if request is None else request
    return min(lane, request)


def bound_reader(conn: apsw.Connection, busy_ms: int) -> None:
    """Make a reader connection honour the deadline of whatever runs on it: the lane
    call's (``LANE_DEADLINE``) and the caller's (``deadline.REQUEST_DEADLINE``), whichever
    comes first; the deadline is read in the thread that runs the query.

    Within a deadline, a query still running when it passes is interrupted
    (``run_bounded`` turns that into ``LaneDeadlineExceeded``, ``deadline.off_loop`` into
    ``DeadlineExceeded``), and a busy database is retried until the deadline at most.
    Outside one (no deadline set), the connection behaves as before: no interruption,
    busy retries for ``busy_ms``."""

    def past_deadline() -> bool:
        deadline = _deadline()
        return deadline is not None and time.monotonic() > deadline

    waiting_since = [0.0]

    def busy(count: int) -> bool:
        now = time.monotonic()
        if count == 0:
            waiting_since[0] = now
        deadline = _deadline()
        if deadline is None:
            deadline = waiting_since[0] + busy_ms / 1000
        if now >= deadline:
            return False
        time.sleep(min(0.001 * (count + 1), 0.02, deadline - now))
        return True

    conn.setprogresshandler(past_deadline, PROGRESS_STEPS)
    conn.setbusyhandler(busy)


class _Store(Protocol):
    BUSY_MS: int
    conn: apsw.Connection


S = TypeVar("S", bound=_Store)


def bound_store(store: S) -> S:
    """``store`` with its connection bound to lane deadlines (``bound_reader``), waiting
    for a busy database as long as the store itself would outside a lane call."""
    bound_reader(store.conn, busy_ms=store.BUSY_MS)
    return store


def finish_kept(
    hits: Sequence[H],
    describe: Callable[[list[H]], Sequence[H]],
    apply: Callable[[Sequence[Any], dict[str, H]], None],
) -> Callable[[Sequence[Any]], None]:
    """A ``LaneResult.finish`` for a lane that ranked ``hits`` (each with an ``id``) and
    returned items without their costly parts: it describes the hits behind the items the
    coordinator kept, in one call, and ``apply`` copies what it needs onto the items. Holds
    only the hits, so a cached lane result stays small. Of equal ids the first counts, as
    in fusion."""
    by_id = {h.id: h for h in reversed(hits)}  # type: ignore[attr-defined]

    def finish(items: Sequence[Any]) -> None:
        # Describing is Python work no query interruption reaches: past the caller's
        # deadline it is not started (the answer is not sent anyway).
        deadline.check()
        wanted = [by_id[it.id] for it in items if it.id in by_id]
        if wanted:
            apply(items, {h.id: h for h in describe(wanted)})  # type: ignore[attr-defined]

    return finish


def run_bounded(fn: Callable[..., R], *args: object) -> R:
    """Run a lane's blocking read work here, on the calling (event loop) thread, within the
    deadline its connections enforce (``bound_reader``)."""
    try:
        return fn(*args)
    except apsw.InterruptError:
        if LANE_DEADLINE.get() is None:
            raise
        raise LaneDeadlineExceeded("stopped at the lane deadline") from None


async def run_with_progress(
    work: Callable[[ProgressFn], index_service_pb2.OperationSummary],
    min_interval: float = 0.1,
) -> AsyncIterator[index_service_pb2.Progress | index_service_pb2.OperationSummary]:
    """Run blocking ``work`` in a thread; yield its progress (throttled), then its summary.

    A failure inside ``work`` propagates to the caller (the transport maps it to a status)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[object] = asyncio.Queue()
    last = [0.0]
    done = object()

    def progress(phase: str, done_n: int, total: int, current: str) -> None:
        now = time.monotonic()
        if done_n < total and now - last[0] < min_interval:
            return
        last[0] = now
        msg = index_service_pb2.Progress(phase=phase, done=done_n, total=total, current=current)
        loop.call_soon_threadsafe(events.put_nowait, msg)

    async def runner() -> index_service_pb2.OperationSummary:
        try:
            return await asyncio.to_thread(work, progress)
        finally:
            loop.call_soon_threadsafe(events.put_nowait, done)

    task = asyncio.create_task(runner())
    try:
        while True:
            item = await events.get()
            if item is done:
                break
            yield item  # type: ignore[misc]
        yield await task
    finally:
        if not task.done():
            # The caller went away (cancelled at shutdown, stream closed): the work's
            # outcome has no reader, so it must not be reported as never retrieved.
            task.add_done_callback(_discard_outcome)


def _discard_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class StorageErrors:
    """A lane's last write that failed on a full disk, for ``GetStatus.last_error``.

    ``guard()`` wraps a write (ingest, index, rebuild, dispatch commit): a full disk
    (SQLITE_FULL, ENOSPC) leaves it as ``StorageFull`` (RESOURCE_EXHAUSTED,
    ``KNOWLEDGE_STORAGE_FULL``) and is remembered; the next write that succeeds clears it.
    """

    CODE = StorageFull.reason

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self.message = ""

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            full = as_storage_full(exc)
            if full is None:
                raise
            self.message = f"{what} failed: {full.message}"
            if full is exc:
                raise
            raise full from exc
        self.message = ""

    def notice(self) -> errors_pb2.Notice | None:
        if not self.message:
            return None
        return errors_pb2.Notice(code=self.CODE, lane=self.lane, message=self.message)
