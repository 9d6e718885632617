"""Closing the episodes lane while an ingest runs (the service stopping mid-ingest)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from knowledge_server.errors import Unavailable
from knowledge_server.lanes.episodes import EpisodesLane


def test_closing_the_lane_stops_a_running_ingest_between_files_and_closes_the_store(
    tmp_path: Path,
) -> None:
    """The service stopping while an ingest runs: the ingest stops before its next file
    (each file's import is its own transaction), the lane waits for it to let go of the
    writer, and the store is closed. Before, the writer's close raised "busy in another
    thread", the stores after it were never closed, and the process waited for the whole
    ingest."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(60):
        lines = [
            {"session_id": f"s{i}", "seq": n, "role": "user", "text": f"message {n} of log {i}"}
            for n in range(300)
        ]
        (logs / f"s{i}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    lane = EpisodesLane(tmp_path / "data")
    started = threading.Event()
    outcome: dict[str, object] = {}

    def progress(phase: str, done: int, total: int, current: str) -> None:
        if done >= 2:
            started.set()

    def run() -> None:
        try:
            outcome["summary"] = lane.ingest_sync([str(logs)], progress)
        except Unavailable as exc:
            outcome["stopped"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(60), "the ingest never began"
    lane.close()  # raised ThreadingViolationError while the ingest held the writer
    worker.join(60)
    assert not worker.is_alive()
    assert "stopped" in outcome, outcome  # stopped early, not run to its end
    with pytest.raises(Exception):  # noqa: B017 - the writer is closed: any use is refused
        lane._writer.index_rev()


def test_the_app_closes_every_store_and_the_audit_log_last(tmp_path: Path) -> None:
    """Shutdown: every store is closed even when one fails to (the first failure left the
    rest open), and the audit log last, after the lanes, whose work still ending appends
    its event as it ends (closed first, an index run cut short lost its event)."""
    from knowledge_server.config import load_config
    from knowledge_server.runtime import build_app

    cfg = load_config(env={}, overrides={"data_dir": str(tmp_path / "data"), "bootstrap": False})
    app = build_app(cfg)
    assert app.audit is not None  # opened, as by the first write
    closed: list[str] = []

    def closer(name: str, real: object, fail: bool = False) -> object:
        def close(*args: object, **kwargs: object) -> None:
            closed.append(name)
            real(*args, **kwargs)  # type: ignore[operator]
            if fail:
                raise RuntimeError("busy")

        return close

    lanes = [(n, lane) for n, lane in app.lanes.reporting() if lane is not None]
    for i, (name, lane) in enumerate(lanes):
        lane.close = closer(name, lane.close, fail=i == 0)  # type: ignore[method-assign]
    app._audit.close = closer("audit", app._audit.close)  # type: ignore[method-assign,union-attr]
    app.close()
    assert closed[-1] == "audit"
    assert set(closed) == {name for name, _ in lanes} | {"audit"}


def test_shutdown_waits_for_an_operator_streams_audit_event_before_closing_the_log(
    tmp_path: Path,
) -> None:
    """AUD-9 at shutdown: an operator stream's work (an ingest stopped before its next
    file) appends its event after its lane let go of the writer; the app's close waits for
    it before closing the audit log. Before, the log could be closed first, and the event
    was lost ("audit.append_failed")."""
    from knowledge_server.audit import AuditLog
    from knowledge_server.auth_model import LOCAL_PRINCIPAL
    from knowledge_server.config import load_config
    from knowledge_server.runtime import build_app

    cfg = load_config(env={}, overrides={"data_dir": str(tmp_path / "data"), "bootstrap": False})
    app = build_app(cfg)
    assert app.audit is not None
    entered, release = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def work() -> None:
        with app.work_running():
            entered.set()
            release.wait(30)
            try:
                app.append_event(LOCAL_PRINCIPAL, "ingest", targets=["stopped"])
            except BaseException as exc:  # noqa: BLE001 - the failure is what is checked
                failed.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    assert entered.wait(10)
    threading.Timer(1.0, release.set).start()  # the work ends while close runs
    app.close()
    worker.join(30)
    assert failed == []
    log = AuditLog(tmp_path / "data" / "audit.sqlite")
    try:
        assert [e.targets for e in log.events() if e.operation == "ingest"] == [("stopped",)]
    finally:
        log.close()


def test_shutdown_does_not_wait_for_work_that_runs_to_its_end(tmp_path: Path) -> None:
    """A document graph build or a derived rebuild does not stop when its lane closes;
    shutdown closes the audit log without waiting for it (it held the serving loop for ten
    seconds), and the event the work writes when it ends is kept in the pending file, for
    the next start to chain (AUD-10; it was lost). An ingest's or an index run's work,
    which stops, is waited for (the test above)."""
    import asyncio

    from knowledge_server.app import _AuditedWork
    from knowledge_server.auth_model import LOCAL_PRINCIPAL
    from knowledge_server.config import load_config
    from knowledge_server.runtime import build_app

    cfg = load_config(env={}, overrides={"data_dir": str(tmp_path / "data"), "bootstrap": False})
    app = build_app(cfg)
    assert app.audit is not None
    started, release = threading.Event(), threading.Event()

    def build(progress: object) -> object:
        started.set()
        release.wait(30)
        raise RuntimeError("stopped")

    async def begin() -> _AuditedWork:
        return _AuditedWork(app, LOCAL_PRINCIPAL, "docgraph.build", [], {})

    audited = asyncio.run(begin())
    worker = threading.Thread(target=lambda: _swallow(audited.of(build)))  # type: ignore[arg-type]
    worker.start()
    assert started.wait(10)
    closing = threading.Thread(target=app.close)
    closing.start()
    closing.join(5)
    try:
        assert not closing.is_alive(), "shutdown waited for a build that runs to its end"
    finally:
        release.set()
        worker.join(30)
        closing.join(30)
    from knowledge_server.audit import AuditLog

    log = AuditLog(Path(cfg.data_dir) / "audit.sqlite")
    try:
        assert log.pending() == 1
        log.append(principal="local", org="", operation="ingest")
        assert [(e.operation, e.outcome) for e in log.events()][-2:] == [
            ("docgraph.build", "KNOWLEDGE_INTERNAL"),
            ("ingest", "ok"),
        ]
    finally:
        log.close()


def _swallow(run: object) -> None:
    try:
        run(lambda *a: None)  # type: ignore[operator]
    except Exception:  # noqa: BLE001, S110 - the work's own failure is not what is checked
        pass
