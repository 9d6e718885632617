"""record_assignment is idempotent under concurrent duplicates (threads and processes)."""

from __future__ import annotations

import multiprocessing as mp
import threading
from pathlib import Path

from knowledge_server.derived import DerivedStore, assignment_id_for
from knowledge_server.lanes.derived import DerivedLane


def test_idempotent_sequential(tmp_path: Path) -> None:
    ds = DerivedStore(str(tmp_path))
    a, created = ds.record_assignment("actor:x", "sha256:t", "/outbox/1.json")
    b, again = ds.record_assignment("actor:x", "sha256:t", "/outbox/other.json")
    assert created and not again
    assert a == b and a.status == "recorded_plan" and a.outbox_path == "/outbox/1.json"
    assert a.assignment_id == assignment_id_for("actor:x", "sha256:t")
    c, other = ds.record_assignment("actor:y", "sha256:t")
    assert other and c.assignment_id != a.assignment_id
    assert len(ds.assignments()) == 2 and ds.assignment(a.assignment_id) == a


def test_threads(tmp_path: Path) -> None:
    shared = DerivedStore(str(tmp_path))
    results: list[tuple[str, bool]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def work(i: int) -> None:
        # half share one connection, half open their own
        ds = shared if i % 2 else DerivedStore(str(tmp_path))
        barrier.wait()
        row, created = ds.record_assignment("actor:t", "sha256:task", f"/o/{i}")
        with lock:
            results.append((row.assignment_id, created))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16
    assert len({r[0] for r in results}) == 1
    assert sum(1 for r in results if r[1]) == 1
    assert len(shared.assignments()) == 1


def _proc(path: str, start: mp.synchronize.Event, out: mp.Queue[tuple[str, bool]]) -> None:
    ds = DerivedStore(path)
    start.wait()
    row, created = ds.record_assignment("actor:p", "sha256:proc", "/o/p")
    out.put((row.assignment_id, created))
    ds.close()


def test_processes(tmp_path: Path) -> None:
    DerivedStore(str(tmp_path)).close()  # create the schema once
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    out = ctx.Queue()
    procs = [ctx.Process(target=_proc, args=(str(tmp_path), start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len({g[0] for g in got}) == 1
    assert sum(1 for g in got if g[1]) == 1
    assert len(DerivedStore(str(tmp_path)).assignments()) == 1


def test_the_lane_records_on_its_own_writer_under_its_writer_lock(tmp_path: Path) -> None:
    """Dispatch records through the derived lane: the row is written by the lane's one
    writer, and waits while the lane's writer lock is held (a rebuild in progress)."""
    lane = DerivedLane(tmp_path, skill_roots=[str(tmp_path / "no-skills")])
    try:
        done = threading.Event()
        got: list[tuple[str, bool]] = []

        def commit() -> None:
            row, created = lane.record_assignment("actor:l", "sha256:lane", "/o/l")
            got.append((row.assignment_id, created))
            done.set()

        with lane._write_lock:
            t = threading.Thread(target=commit)
            t.start()
            assert not done.wait(0.3)  # queued behind the holder
        t.join(timeout=10)
        assert got == [(assignment_id_for("actor:l", "sha256:lane"), True)]
        again, created = lane.record_assignment("actor:l", "sha256:lane", "/o/other")
        assert not created and again.outbox_path == "/o/l"
        assert [a.assignment_id for a in lane._writer.assignments()] == [got[0][0]]
        # Nothing has been built yet: planning reads nothing from the store.
        with lane.built_store() as store:
            assert store is None
    finally:
        lane.close()
