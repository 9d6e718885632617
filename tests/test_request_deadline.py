"""The caller's deadline applied to blocking work (knowledge_server.deadline): work in the
request pool is given up at the deadline, queries on reader connections stop there (in a
thread or on the loop), work still queued then never runs, and without a deadline nothing
is cut short.

The endless query is a recursive CTE that never ends by itself: only an interruption
stops it, so the tests do not depend on the machine's speed; the time bounds are generous.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import apsw
import pytest
from knowledge_server import deadline
from knowledge_server.errors import DeadlineExceeded
from knowledge_server.lanes.common import READERS, bound_reader, run_bounded

ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n"
FINITE = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000)"
    " SELECT max(i) FROM n"
)
MARGIN = 1.5  # seconds past the deadline a shared machine may take to notice it


def _reader() -> apsw.Connection:
    conn = apsw.Connection(":memory:")
    bound_reader(conn, busy_ms=10_000)
    return conn


async def test_work_in_the_pool_answers_at_the_deadline_and_its_query_stops() -> None:
    conn = _reader()
    stopped = threading.Event()

    def endless() -> object:
        try:
            return conn.execute(ENDLESS).fetchall()
        finally:
            stopped.set()

    started = time.monotonic()
    with deadline.within(0.2), pytest.raises(DeadlineExceeded):
        await deadline.off_loop(endless, pool="test-deadline")
    assert time.monotonic() - started < 0.2 + MARGIN
    # The thread does not run on with the query: it stopped at the same deadline.
    assert await asyncio.to_thread(stopped.wait, MARGIN)


async def test_a_query_on_the_loop_stops_at_the_callers_deadline() -> None:
    conn = _reader()
    started = time.monotonic()
    with (
        deadline.within(0.2),
        pytest.raises(DeadlineExceeded),
        deadline.interrupted_as_deadline(),
    ):
        run_bounded(lambda: conn.execute(ENDLESS).fetchall())
    assert time.monotonic() - started < 0.2 + MARGIN


async def test_work_queued_past_its_deadline_never_runs() -> None:
    release = threading.Event()
    ran: list[str] = []
    holding: list[int] = []
    loop = asyncio.get_running_loop()
    all_taken = asyncio.Event()

    def hold() -> None:
        holding.append(1)
        if len(holding) == deadline.POOL_THREADS:
            loop.call_soon_threadsafe(all_taken.set)
        release.wait(30)

    busy = [
        asyncio.ensure_future(deadline.off_loop(hold, pool="test-queued"))
        for _ in range(deadline.POOL_THREADS)
    ]
    try:
        await asyncio.wait_for(all_taken.wait(), 10)
        with deadline.within(0.2), pytest.raises(DeadlineExceeded):
            await deadline.off_loop(ran.append, "late", pool="test-queued")
    finally:
        release.set()
        await asyncio.gather(*busy)
    await deadline.off_loop(
        time.sleep, 0.05, pool="test-queued"
    )  # a thread has been free since the release
    assert ran == []


async def test_without_a_deadline_nothing_is_cut_short() -> None:
    conn = _reader()
    assert deadline.remaining() is None
    rows = await deadline.off_loop(lambda: conn.execute(FINITE).fetchall(), pool="test-deadline")
    assert rows == [(300000,)]
    assert await deadline.awaited(asyncio.sleep(0.05, "done")) == "done"


async def test_a_deadline_already_passed_runs_nothing() -> None:
    ran: list[str] = []
    with deadline.within(-1):
        with pytest.raises(DeadlineExceeded):
            await deadline.off_loop(ran.append, "x", pool="test-deadline")
        with pytest.raises(DeadlineExceeded):
            await deadline.awaited(deadline.off_loop(ran.append, "y", pool="test-deadline"))
    assert ran == []


async def test_awaited_work_is_cancelled_at_the_deadline() -> None:
    started = time.monotonic()
    with deadline.within(0.2), pytest.raises(DeadlineExceeded):
        await deadline.awaited(asyncio.sleep(30))
    assert time.monotonic() - started < 0.2 + MARGIN


async def test_a_timeout_inside_the_work_stays_a_timeout() -> None:
    async def times_out() -> None:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(30)

    with deadline.within(30), pytest.raises(TimeoutError):
        await deadline.awaited(times_out())


def test_a_busy_database_is_waited_for_until_the_callers_deadline_only(tmp_path: Path) -> None:
    path = str(tmp_path / "locked.sqlite")
    holder = apsw.Connection(path)
    holder.execute("CREATE TABLE t(x); BEGIN EXCLUSIVE; INSERT INTO t VALUES (1)")
    reader = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    bound_reader(reader, busy_ms=10_000)  # outside a deadline it would wait 10 s
    started = time.monotonic()
    try:
        with (
            deadline.within(0.2),
            pytest.raises(DeadlineExceeded),
            deadline.interrupted_as_deadline(),
        ):
            reader.execute("SELECT count(*) FROM t").fetchall()
    finally:
        holder.execute("ROLLBACK")
    assert time.monotonic() - started < 0.2 + MARGIN


def test_an_interruption_without_a_passed_deadline_is_not_a_deadline() -> None:
    with deadline.within(30), pytest.raises(apsw.InterruptError):
        with deadline.interrupted_as_deadline():
            raise apsw.InterruptError("interrupted")


def test_within_keeps_an_earlier_deadline() -> None:
    with deadline.within(1):
        outer = deadline.REQUEST_DEADLINE.get()
        with deadline.within(60):
            assert deadline.REQUEST_DEADLINE.get() == outer
        with deadline.within(0.5):
            inner = deadline.REQUEST_DEADLINE.get()
            assert inner is not None and outer is not None and inner < outer
    assert deadline.REQUEST_DEADLINE.get() is None


def test_a_store_has_a_reader_for_the_loop_and_every_thread_that_reads_it() -> None:
    # The loop's searches never wait for a reader the request threads hold: a store is
    # read from its lane's pool, the status pool and the dispatch pool.
    assert READERS > 3 * deadline.POOL_THREADS
