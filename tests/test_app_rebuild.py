"""The derived layer's rebuild after ingests nobody waits for (a live batch, an
IngestSessions whose caller went away): ``KnowledgeApp.ingested``.

One rebuild at a time, at most every REBUILD_AFTER_INGEST_S whether or not the asks come
while one runs, and none left running under stores that are closing."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest
from knowledge_server import app as app_mod

from tests.conftest import start_server


async def test_rebuilds_are_spaced_by_the_least_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A harness writing steadily asks after every batch; rebuilds start at least the
    interval apart, also when no ask came while the previous one ran."""
    monkeypatch.setattr(app_mod, "REBUILD_AFTER_INGEST_S", 0.6)
    rs = await start_server(tmp_path)
    starts: list[float] = []

    async def rebuild() -> None:
        starts.append(time.monotonic())
        await asyncio.sleep(0.05)

    rs.app.after_ingest = rebuild  # type: ignore[method-assign]
    try:
        began = time.monotonic()
        while time.monotonic() - began < 2.0:
            rs.app.ingested()
            await asyncio.sleep(0.25)  # longer than a rebuild: asks also come between them
        await asyncio.sleep(0.8)
        assert 2 <= len(starts) <= 5, starts
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert all(gap >= 0.55 for gap in gaps), gaps
    finally:
        await rs.server.stop(0)
        rs.app.close()


async def test_closing_waits_for_a_running_rebuild_and_starts_no_new_one(
    tmp_path: Path,
) -> None:
    rs = await start_server(tmp_path)
    release = asyncio.Event()
    runs: list[str] = []

    async def rebuild() -> None:
        runs.append("started")
        await release.wait()
        runs.append("ended")

    rs.app.after_ingest = rebuild  # type: ignore[method-assign]
    try:
        rs.app.ingested()
        await asyncio.sleep(0.05)
        settling = asyncio.create_task(rs.app.settle(5.0))
        await asyncio.sleep(0.1)
        assert not settling.done()  # waits for the rebuild
        release.set()
        await asyncio.wait_for(settling, 2.0)
        assert runs == ["started", "ended"]
        rs.app.ingested()  # closing: nothing more starts
        await asyncio.sleep(0.05)
        assert runs == ["started", "ended"]
    finally:
        await rs.server.stop(0)
        rs.app.close()


async def test_a_rebuild_past_the_grace_is_cut_short(tmp_path: Path) -> None:
    rs = await start_server(tmp_path)
    forever = asyncio.Event()

    async def rebuild() -> None:
        await forever.wait()

    rs.app.after_ingest = rebuild  # type: ignore[method-assign]
    try:
        rs.app.ingested()
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await rs.app.settle(0.3)
        assert 0.25 <= time.monotonic() - started < 2.0
        await asyncio.sleep(0.05)
        assert rs.app._rebuild is not None and rs.app._rebuild.cancelled()
    finally:
        await rs.server.stop(0)
        rs.app.close()


async def test_closing_while_the_next_rebuild_waits_its_interval_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebuild asked again while it ran waits out the interval before the next one: no
    rebuild runs then, so closing cancels it at once, without waiting the grace or saying
    a rebuild was cut short."""
    monkeypatch.setattr(app_mod, "REBUILD_AFTER_INGEST_S", 30.0)
    rs = await start_server(tmp_path)
    runs: list[float] = []

    async def rebuild() -> None:
        runs.append(time.monotonic())
        rs.app.ingested()  # asked again while it runs
        await asyncio.sleep(0.05)

    rs.app.after_ingest = rebuild  # type: ignore[method-assign]
    try:
        rs.app.ingested()
        await asyncio.sleep(0.3)
        assert len(runs) == 1 and rs.app._rebuild is not None and not rs.app._rebuild.done()
        await asyncio.wait_for(rs.app.settle(20.0), 2.0)
        await asyncio.sleep(0.05)
        assert rs.app._rebuild.cancelled() and len(runs) == 1
        assert "rebuild_cut_short" not in caplog.text
    finally:
        await rs.server.stop(0)
        rs.app.close()
