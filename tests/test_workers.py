"""`serve --workers N`: several real processes on one port, started, stopped and cleaned
up together; and the cross-process writer lock they rely on."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from knowledge_sdk import KnowledgeClient
from knowledge_server.lanes.common import WriterLock

from tests.conftest import serve_process


def _listeners(port: int) -> int:
    """Listening TCP sockets on ``port`` (one per serving process with SO_REUSEPORT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 (after the parenthesised command) is the parent pid.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait(predicate, timeout: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _start(tmp_path: Path, workers: int) -> tuple[subprocess.Popen[str], str]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "app.py").write_text("def handler():\n    return 1\n")
    proc = serve_process(tmp_path / "data", "--workspace", str(ws), "--workers", str(workers))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening on"), line + (
        proc.stderr.read() if proc.poll() is not None else ""
    )
    return proc, line.split()[-1]


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_workers_share_the_port_answer_and_stop_together(tmp_path: Path) -> None:
    proc, address = _start(tmp_path, workers=3)
    port = int(address.rsplit(":", 1)[1])
    try:
        # Every process has its own listening socket on the same port before the address is printed.
        assert _listeners(port) == 3
        workers = _children(proc.pid)
        assert len([p for p in workers if _alive(p)]) >= 2
        for _ in range(12):  # fresh connections: the kernel spreads them over the processes
            with KnowledgeClient(address, timeout=20) as kc:
                assert kc.get_status().edition.edition == "community"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert _wait(lambda: not any(_alive(p) for p in workers))
    assert _listeners(port) == 0
    # Only the first process prints the address.
    assert proc.stdout is not None and "listening on" not in proc.stdout.read()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_a_worker_stops_when_its_first_process_is_killed(tmp_path: Path) -> None:
    proc, address = _start(tmp_path, workers=2)
    port = int(address.rsplit(":", 1)[1])
    workers = [p for p in _children(proc.pid) if _alive(p)]
    assert workers
    proc.kill()
    proc.wait(timeout=30)
    assert _wait(lambda: not any(_alive(p) for p in workers), timeout=30)
    assert _wait(lambda: _listeners(port) == 0)


def test_workers_setting_is_validated(tmp_path: Path) -> None:
    env = dict(os.environ, KNOWLEDGE_DATA_DIR=str(tmp_path / "data"), KNOWLEDGE_WORKERS="0")
    out = subprocess.run(
        [sys.executable, "-m", "knowledge_server.cli", "serve", "--listen", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "workers" in out.stderr and "1..64" in out.stderr


def _hold(data_dir: str, held: mp.synchronize.Event, release: mp.synchronize.Event) -> None:
    with WriterLock(data_dir, "episodes"):
        held.set()
        release.wait(30)


def test_writer_lock_excludes_other_processes(tmp_path: Path) -> None:
    """While another process holds a store's writer lock, this one waits; it gets the lock
    as soon as the holder lets go (and would if the holder died: the kernel drops it)."""
    ctx = mp.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), held, release))
    holder.start()
    try:
        assert held.wait(30)
        got = threading.Event()

        def take() -> None:
            with WriterLock(tmp_path, "episodes"):
                got.set()

        t = threading.Thread(target=take, daemon=True)
        t.start()
        assert not got.wait(0.5)
        release.set()
        assert got.wait(30)
        t.join(10)
    finally:
        release.set()
        holder.join(30)


def _open_all(data_dir: str, barrier: mp.synchronize.Barrier, errors: mp.Queue) -> None:  # type: ignore[type-arg]
    from knowledge_server.code.store import open_store
    from knowledge_server.derived.store import DerivedStore
    from knowledge_server.docgraph.store import DocGraphStore
    from knowledge_server.episodes.store import EpisodeStore

    try:
        barrier.wait(30)
        for _ in range(5):
            open_store(os.path.join(data_dir, "code.sqlite")).close()
            EpisodeStore(os.path.join(data_dir, "episodes.sqlite")).close()
            DerivedStore(os.path.join(data_dir, "derived.sqlite")).close()
            DocGraphStore(data_dir).close()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        import traceback

        errors.put(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")


def test_stores_open_concurrently_in_several_processes(tmp_path: Path) -> None:
    """Worker processes open every store at the same moment, fresh or not: schema
    creation must queue (BEGIN IMMEDIATE) instead of failing with 'database is locked'."""
    ctx = mp.get_context("spawn")
    barrier, errors = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_open_all, args=(str(tmp_path), barrier, errors)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found
    assert all(p.exitcode == 0 for p in procs)


def _closes_its_pipe_then_exits(writer: Any) -> None:
    writer.close()
    time.sleep(0.5)  # still exiting when the first process reads the end of its pipe
    sys.exit(3)


def test_a_worker_that_closes_its_pipe_is_reported_by_its_exit_not_a_timeout() -> None:
    """A worker ending during start-up (a Ctrl-C to the process group) closes its pipe
    before it has exited: reported by its exit code, not as "no answer within 120s", a
    timeout that never happened."""
    from knowledge_server.workers import _read_ready

    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_closes_its_pipe_then_exits, args=(writer,))
    proc.start()
    writer.close()
    try:
        assert _read_ready(reader, proc, 120) == "exited with code 3"
    finally:
        proc.join(10)
        reader.close()
