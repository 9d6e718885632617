"""Operator streams whose caller goes away mid-stream, over a real server.

AUD-9: the work of IndexWorkspace (and of every operator stream: IngestSessions,
RebuildDerived, BuildDocGraph) runs on to its end when the caller cancels the stream, and
its audit event is written when the work ends, with the revision it produced or the
reason it failed, whether or not anyone still reads the stream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import grpc
import pytest
from knowledge_server._gen.knowledge.v1 import index_service_pb2 as ipb
from knowledge_server._gen.knowledge.v1 import index_service_pb2_grpc as igrpc
from knowledge_server.audit import AuditLog

from tests.conftest import start_server, write_session_log


def _gated(real: Callable[..., Any], gate: threading.Event, fail: bool) -> Callable[..., Any]:
    """The lane's index_sync, held at its start until ``gate`` opens (after the caller has
    gone); with ``fail``, it then raises instead of indexing."""

    def run(
        root: str, full: bool, progress: Callable[[str, int, int, str], None], within: Any = None
    ) -> Any:
        progress("walk", 0, 1, "")
        if not gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        if fail:
            raise RuntimeError("disk went away")
        return real(root, full, progress, within)

    return run


async def _cancel_after_first_message(address: str, root: Path) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = igrpc.IndexServiceStub(channel).IndexWorkspace(
            ipb.IndexWorkspaceRequest(root=str(root), full=True)
        )
        first = await call.read()
        assert first is not grpc.aio.EOF
        call.cancel()


async def _events(log: AuditLog, n: int) -> list[Any]:
    for _ in range(200):
        events = [e for e in log.events() if e.operation == "index"]
        if len(events) >= n:
            return events
        await asyncio.sleep(0.05)
    return [e for e in log.events() if e.operation == "index"]


async def test_aud9_a_cancelled_index_stream_is_audited_when_its_work_ends(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("def handler(request):\n    return request\n")
    rs = await start_server(tmp_path)
    lane = rs.app.lanes.code
    real = lane.index_sync
    log = AuditLog(Path(rs.config.data_dir) / "audit.sqlite")
    try:
        gate = threading.Event()
        lane.index_sync = _gated(real, gate, fail=False)
        await _cancel_after_first_message(rs.address, ws)
        await asyncio.sleep(0.3)
        assert not [e for e in log.events() if e.operation == "index"]  # the work runs on
        gate.set()
        events = await _events(log, 1)
        assert len(events) == 1
        (event,) = events
        assert event.outcome == "ok"
        assert event.targets[0] == str(ws)
        assert event.targets[1] == lane.status(None).index_rev and event.targets[1]

        failing = threading.Event()
        lane.index_sync = _gated(real, failing, fail=True)
        await _cancel_after_first_message(rs.address, ws)
        failing.set()
        events = await _events(log, 2)
        assert [e.outcome for e in events] == ["ok", "KNOWLEDGE_INTERNAL"]
        assert events[1].targets == (str(ws),)
        assert log.verify().ok
    finally:
        lane.index_sync = real
        await rs.server.stop(0)


async def test_aud9_streams_ending_together_open_the_audit_log_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The work threads of two operator streams that end at the same instant both append
    their events; the app's audit log is opened once (a second one was never closed)."""
    from knowledge_sdk import AsyncKnowledgeClient
    from knowledge_server import app as app_mod

    opened: list[int] = []
    real_init = app_mod.AuditLog.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        opened.append(threading.get_ident())
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(app_mod.AuditLog, "__init__", counting)
    roots = []
    for name in ("w1", "w2"):
        ws = tmp_path / name
        ws.mkdir()
        (ws / "a.py").write_text("def f():\n    return 1\n")
        roots.append(ws)
    rs = await start_server(tmp_path)
    lane = rs.app.lanes.code
    real = lane.index_sync
    together = threading.Barrier(2)

    def at_once(
        root: str, full: bool, progress: Callable[[str, int, int, str], None], within: Any = None
    ) -> Any:
        out = real(root, full, progress, within)
        together.wait(10)
        return out

    lane.index_sync = at_once
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:

            async def index(root: Path) -> None:
                async for _ in kc.index_workspace(str(root)):
                    pass

            await asyncio.gather(*(index(r) for r in roots))
        assert len(opened) == 1
        events = [e for e in rs.app.audit.events() if e.operation == "index"]
        assert sorted(e.targets[0] for e in events) == [str(r) for r in roots]
    finally:
        lane.index_sync = real
        await rs.server.stop(0)


async def _ok_operations_once_rebuilt(log: AuditLog) -> list[str]:
    """The operations recorded ok, once a derived rebuild is among them (or after 10 s)."""
    ops: list[str] = []
    for _ in range(200):
        ops = [e.operation for e in log.events() if e.outcome == "ok"]
        if "derived.rebuild" in ops:
            break
        await asyncio.sleep(0.05)
    return ops


async def test_aud9_a_cancelled_ingest_is_audited_and_the_derived_layer_still_follows(
    tmp_path: Path,
) -> None:
    """IngestSessions cancelled mid-stream: the ingest runs on to its end, its event is
    written, and the derived layer is rebuilt after it (the rebuild used to run in the
    stream, after its last message, and was lost with it)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_session_log(logs / "a.jsonl", "sess-a", tmp_path, "deploy the staging app")
    rs = await start_server(tmp_path)
    lane = rs.app.lanes.episodes
    real = lane.ingest_sync
    gate = threading.Event()

    def held(paths: Any, progress: Callable[[str, int, int, str], None], scope: Any) -> Any:
        progress("read", 0, 1, "")
        if not gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return real(paths, progress, scope)

    lane.ingest_sync = held
    log = AuditLog(Path(rs.config.data_dir) / "audit.sqlite")
    try:
        async with grpc.aio.insecure_channel(rs.address) as channel:
            call = igrpc.IndexServiceStub(channel).IngestSessions(
                ipb.IngestSessionsRequest(paths=[str(logs)])
            )
            assert await call.read() is not grpc.aio.EOF
            call.cancel()
        gate.set()
        ops = await _ok_operations_once_rebuilt(log)
        assert ops == ["ingest", "derived.rebuild"], ops
        skills = rs.app.lanes.skills
        assert skills is not None
        with skills.built_store() as store:
            assert store is not None and store.counts()["actors"] == 1
    finally:
        lane.ingest_sync = real
        await rs.server.stop(0)


async def test_aud9_a_call_cancelled_during_its_derived_rebuild_rebuilds_once(
    tmp_path: Path,
) -> None:
    """IngestSessions cancelled while the derived rebuild after its ingest runs: that
    rebuild runs on to its end and is the only one (the stream asked for another in its
    place when it ended, so the layer was derived twice, with two events)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_session_log(logs / "a.jsonl", "sess-a", tmp_path, "deploy the staging app")
    rs = await start_server(tmp_path)
    skills = rs.app.lanes.skills
    assert skills is not None
    real = skills.rebuild_sync
    entered, gate = threading.Event(), threading.Event()
    calls: list[bool] = []

    def held(*args: Any) -> Any:
        calls.append(True)
        entered.set()
        if not gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return real(*args)

    skills.rebuild_sync = held  # type: ignore[method-assign]
    log = AuditLog(Path(rs.config.data_dir) / "audit.sqlite")
    try:
        async with grpc.aio.insecure_channel(rs.address) as channel:
            call = igrpc.IndexServiceStub(channel).IngestSessions(
                ipb.IngestSessionsRequest(paths=[str(logs)])
            )
            assert await asyncio.to_thread(entered.wait, 30), "the rebuild never started"
            call.cancel()
        await asyncio.sleep(0.5)  # the server ends the call while the rebuild is held
        gate.set()
        await _ok_operations_once_rebuilt(log)  # the first rebuild is recorded
        asked_again = rs.app._rebuild
        if asked_again is not None:
            await asyncio.wait_for(asked_again, 30)
        ops = [e.operation for e in log.events() if e.outcome == "ok"]
        assert ops == ["ingest", "derived.rebuild"], ops
        assert len(calls) == 1
    finally:
        gate.set()
        skills.rebuild_sync = real  # type: ignore[method-assign]
        await rs.server.stop(0)


async def test_aud10_a_memory_write_while_the_log_is_busy_answers_ok_and_is_recorded(
    tmp_path: Path,
) -> None:
    """AUD-10 over gRPC: the audit log's write lock is held elsewhere past the wait while a
    memory write commits. The caller is answered as the write went (OK, not INTERNAL: a
    retry would count a second confirmation), and the write's event joins the chain at
    the next append. Before, the write stayed and had no event at all."""
    from knowledge_sdk import AsyncKnowledgeClient

    rs = await start_server(tmp_path)
    data = tmp_path / "data"
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            await kc.remember("warmup", "k", "opens the audit log")
            # The served app's log, waiting a tenth of a second for the lock, not ten.
            rs.app._audit.close()
            rs.app._audit = AuditLog(data / "audit.sqlite", busy_ms=100)
            holder = apsw.Connection(str(data / "audit.sqlite"))
            holder.execute("BEGIN IMMEDIATE")
            try:
                first = await kc.remember("db", "port", "staging db listens on 5433")
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            assert first.outcome == "created"
            second = await kc.remember("db", "host", "staging db runs on db-2")
            assert second.outcome == "created"
        log = AuditLog(data / "audit.sqlite")
        try:
            remembered = [e for e in log.events() if e.operation == "memory.remember"]
            assert len(remembered) == 3
            assert [e.targets for e in remembered[1:]] == [(first.entry.id,), (second.entry.id,)]
            assert log.verify().ok and log.pending() == 0
        finally:
            log.close()
    finally:
        await rs.server.stop(0)
        rs.app.close()
