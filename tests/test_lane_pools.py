"""The request thread pools (knowledge_server.deadline.off_loop), which run the blocking
work that is not a search on the loop (GetEpisode, GetChunk, GetStatus, dispatch planning,
document-graph operations; searches read on the loop within their deadline,
tests/test_lane_deadline.py).

Invariants: a pool whose threads are all busy does not delay another pool's work, and work
whose caller gave up before a thread was free is never run.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from knowledge_server import deadline


async def test_busy_pool_does_not_delay_another_lane() -> None:
    release = threading.Event()
    pool = "test-busy"
    stuck = [
        asyncio.ensure_future(deadline.off_loop(release.wait, 10, pool=pool))
        for _ in range(deadline.POOL_THREADS)
    ]
    try:
        # The other lane answers at once while every thread of the first is blocked.
        assert await asyncio.wait_for(deadline.off_loop(lambda: 42, pool="test-free"), 2) == 42
    finally:
        release.set()
        await asyncio.gather(*stuck)


async def test_query_given_up_before_a_thread_is_free_never_runs() -> None:
    release = threading.Event()
    ran: list[int] = []
    pool = "test-cancel"
    stuck = [
        asyncio.ensure_future(deadline.off_loop(release.wait, 10, pool=pool))
        for _ in range(deadline.POOL_THREADS)
    ]
    await asyncio.sleep(0.05)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(deadline.off_loop(ran.append, 1, pool=pool), 0.05)
    release.set()
    await asyncio.gather(*stuck)
    # The pool is free again: later work runs, the abandoned query did not.
    await deadline.off_loop(ran.append, 2, pool=pool)
    assert ran == [2]
