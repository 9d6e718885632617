"""The PROCESS queue and its processing on a real kb.sqlite: idempotency keys, retry and
cancel, recovery of a task left RUNNING by a dead process, the steps (convert, chunk,
embed, stage), failures with their category, and reconcile."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from knowledge_server.auth_model import Principal
from knowledge_server.code.embed import EmbeddingError, HashingEmbedder
from knowledge_server.errors import IllegalTransition, StaleVersion
from knowledge_server.kb import pipeline
from knowledge_server.kb.service import KnowledgeBase
from knowledge_server.kb.tasks import MAX_ATTEMPTS

from tests.kb_fakes import MemoryIndex

ED = Principal("ed", "org-a", None, "operator")
REV = Principal("rev", "org-a", None, "operator")
B = Principal("ed-b", "org-b", None, "operator")

DOC = """---
eip: 1
title: Example
---
# Example proposal

Intro paragraph about refunds.

## Motivation

Refunds take three days.

### Details

```
# not a heading
```
"""


def _kb(tmp_path: Path, index: MemoryIndex | None = None, embedder: object = None) -> KnowledgeBase:
    return KnowledgeBase(
        tmp_path,
        index=index or MemoryIndex(),
        embedder=embedder or HashingEmbedder(),  # type: ignore[arg-type]
    )


def _approved(kb: KnowledgeBase, key: str = "k", doc: str = DOC, who: Principal = ED) -> str:
    wf = kb.workflow
    topic = wf.create_topic(who, key, "Example")
    rev = wf.create_revision(who, topic.id, "1.0")
    part = kb.store.upload_dir / "up_test.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_text(doc)
    sha, size = kb.store.keep_blob(part)
    rev, _ = wf.add_file_source(
        who, rev.id, rev.version, file_name="eip-1.md", media_type="", sha256=sha, size=size
    )
    rev, _ = wf.put_faq(who, rev.id, rev.version, question="How long?", answer="Three days.")
    rev = wf.submit(who, rev.id, rev.version)
    rev = wf.approve(Principal("reviewer", who.organisation, None, "operator"), rev.id, rev.version)
    return rev.id


def _run_all(kb: KnowledgeBase) -> None:
    while (task := kb.queue.claim("test-owner")) is not None:
        kb.process_task(task)


async def _until_ended(kb: KnowledgeBase, task_id: str) -> None:
    """Wait (10 s at most) for a task a worker runs to end."""
    for _ in range(200):
        await asyncio.sleep(0.05)
        row = kb.store.task("org-a", task_id)
        if row is not None and row.state in ("SUCCEEDED", "FAILED"):
            return


def test_same_idempotency_key_runs_once(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    v = kb.store.revision("org-a", rev_id).version  # type: ignore[union-attr]
    first = kb.queue.enqueue(ED, rev_id, v, "key-1")
    again = kb.queue.enqueue(ED, rev_id, v, "key-1")
    assert first.created and not again.created and again.task.id == first.task.id
    with pytest.raises(IllegalTransition):  # another key while one is queued
        kb.queue.enqueue(ED, rev_id, v, "key-2")
    _run_all(kb)
    assert kb.index.stage_calls == 1  # type: ignore[union-attr]
    done = kb.queue.enqueue(ED, rev_id, v, "key-1")  # after the run: still the same task
    assert not done.created and done.task.state == "SUCCEEDED"
    _run_all(kb)
    assert kb.index.stage_calls == 1  # type: ignore[union-attr]


def test_default_key_is_the_revision_version(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    v = kb.store.revision("org-a", rev_id).version  # type: ignore[union-attr]
    assert kb.queue.enqueue(ED, rev_id, v).created
    assert not kb.queue.enqueue(ED, rev_id, v).created


def test_process_needs_an_approved_revision_and_the_current_version(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    topic = kb.workflow.create_topic(ED, "d", "D")
    draft = kb.workflow.create_revision(ED, topic.id, "1")
    with pytest.raises(IllegalTransition):
        kb.queue.enqueue(ED, draft.id, draft.version)
    rev_id = _approved(kb, "e")
    with pytest.raises(StaleVersion):
        kb.queue.enqueue(ED, rev_id, 1)


def test_processing_stages_structured_chunks_and_records_embed_calls(tmp_path: Path) -> None:
    index = MemoryIndex()
    kb = _kb(tmp_path, index)
    rev_id = _approved(kb)
    rev = kb.store.revision("org-a", rev_id)
    assert rev is not None
    task = kb.queue.enqueue(ED, rev_id, rev.version).task
    _run_all(kb)
    done = kb.store.task("org-a", task.id)
    assert done is not None and done.state == "SUCCEEDED" and done.step == "done"
    rev = kb.store.revision("org-a", rev_id)
    assert rev is not None and rev.state == "PROCESSED"
    assert rev.embed_model == HashingEmbedder().identity
    chunks = index.get_chunks("org-a", [f"{rev_id}:{i}" for i in range(10)])
    assert rev.chunk_count == len(chunks) == index.revision_counts("org-a")[("org-a", rev_id)]
    by_text = {c.text: c for c in chunks}
    assert by_text["Refunds take three days."].section_path == ("Example proposal", "Motivation")
    assert by_text["How long?\nThree days."].kind == "faq"  # question and answer together
    assert all(c.title == "Example" for c in chunks)
    assert not any("eip: 1" in c.text for c in chunks)  # front matter left out
    fence = next(c for c in chunks if "not a heading" in c.text)
    assert fence.section_path[-1] == "Details"
    calls = kb.store.embed_calls("org-a", task.id)
    assert calls and all(m == HashingEmbedder().identity and f == "" for m, _, _, f in calls)
    assert sum(n for _, n, _, _ in calls) == len(chunks)
    assert index.revision_counts("org-b") == {}


class FailingEmbedder(HashingEmbedder):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message
        self.fail = True

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail:
            raise EmbeddingError(self.message)
        return super().embed(texts)


def test_embedder_failure_fails_the_task_with_a_category_and_retry_recovers(tmp_path: Path) -> None:
    embedder = FailingEmbedder("request timed out")
    kb = _kb(tmp_path, embedder=embedder)
    rev_id = _approved(kb)
    v = kb.store.revision("org-a", rev_id).version  # type: ignore[union-attr]
    task = kb.queue.enqueue(ED, rev_id, v).task
    _run_all(kb)
    failed = kb.store.task("org-a", task.id)
    assert failed is not None and failed.state == "FAILED"
    assert failed.error_category == "embed_timeout"
    assert kb.store.revision("org-a", rev_id).state == "FAILED"  # type: ignore[union-attr]
    assert kb.store.embed_calls("org-a", task.id)[0][3] == "embed_timeout"
    assert kb.index.revision_counts() == {}  # type: ignore[union-attr]
    with pytest.raises(IllegalTransition):  # a FAILED revision is retried, not enqueued
        kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version)  # type: ignore[union-attr]
    with pytest.raises(StaleVersion):
        kb.queue.retry(ED, task.id, failed.version - 1)
    embedder.fail = False
    retried = kb.queue.retry(ED, task.id, failed.version)
    assert retried.state == "QUEUED"
    _run_all(kb)
    assert kb.store.revision("org-a", rev_id).state == "PROCESSED"  # type: ignore[union-attr]


def test_unsupported_source_fails_with_its_category(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    wf = kb.workflow
    topic = wf.create_topic(ED, "x", "X")
    rev = wf.create_revision(ED, topic.id, "1")
    part = kb.store.upload_dir / "up_x.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(b"\xff\xfe binary")
    sha, size = kb.store.keep_blob(part)
    rev, _ = wf.add_file_source(
        ED, rev.id, rev.version, file_name="a.md", media_type="", sha256=sha, size=size
    )
    rev = wf.submit(ED, rev.id, rev.version)
    rev = wf.approve(REV, rev.id, rev.version)
    task = kb.queue.enqueue(ED, rev.id, rev.version).task
    _run_all(kb)
    out = kb.store.task("org-a", task.id)
    assert out is not None and out.error_category == "unreadable"
    assert pipeline.media_type_of("a.exe") is None


def test_cancel_only_a_task_not_started(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    v = kb.store.revision("org-a", rev_id).version  # type: ignore[union-attr]
    task = kb.queue.enqueue(ED, rev_id, v, "c1").task
    with pytest.raises(IllegalTransition):
        kb.queue.retry(ED, task.id, task.version)
    cancelled = kb.queue.cancel(ED, task.id, task.version)
    assert cancelled.state == "CANCELLED"
    assert kb.queue.claim("o") is None
    assert kb.store.revision("org-a", rev_id).state == "APPROVED"  # type: ignore[union-attr]
    running = kb.queue.enqueue(ED, rev_id, v, "c2").task
    claimed = kb.queue.claim("o")
    assert claimed is not None and claimed.id == running.id
    with pytest.raises(IllegalTransition):
        kb.queue.cancel(ED, running.id, claimed.version)


def test_a_revision_to_process_is_claimed_before_older_restages(tmp_path: Path) -> None:
    """A backlog of RESTAGE tasks (a reconcile's, or the one an upgrade queues for every
    indexed revision) never holds up an editor's revision: PROCESS tasks are claimed first,
    then the restages, oldest first."""
    kb = _kb(tmp_path)
    done = []
    for key in ("a", "b"):
        rev_id = _approved(kb, key)
        v = kb.store.revision("org-a", rev_id).version  # type: ignore[union-attr]
        kb.queue.enqueue(ED, rev_id, v, f"p-{key}")
        _run_all(kb)
        done.append(rev_id)
    restages = [kb.queue.enqueue_restage("org-a", rev_id, "server") for rev_id in done]
    assert all(r is not None for r in restages)
    waiting = _approved(kb, "c")
    v = kb.store.revision("org-a", waiting).version  # type: ignore[union-attr]
    process = kb.queue.enqueue(ED, waiting, v, "p-c").task
    order = []
    while (task := kb.queue.claim("o")) is not None:
        order.append(task.id)
        kb.queue.succeed(task, 1, "m")
    assert order == [process.id, *(r.id for r in restages if r is not None)]


def test_tasks_of_another_organisation_are_not_found(tmp_path: Path) -> None:
    from knowledge_server.errors import NotFound

    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    task = kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version).task  # type: ignore[union-attr]
    with pytest.raises(NotFound):
        kb.queue.cancel(B, task.id, task.version)
    with pytest.raises(NotFound):
        kb.queue.enqueue(B, rev_id, 1)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_task_left_running_by_a_dead_process_is_resumed(tmp_path: Path) -> None:
    import socket

    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    task = kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version).task  # type: ignore[union-attr]
    dead = f"{socket.gethostname()}:{_dead_pid()}:abcd"
    claimed = kb.queue.claim(dead)
    assert claimed is not None
    kb.queue.progress(claimed, "embed", 3, 10)
    assert kb.store.revision("org-a", rev_id).state == "PROCESSING"  # type: ignore[union-attr]
    live = f"{socket.gethostname()}:1:live"  # pid 1 exists: its task is left alone
    second = _approved(kb, "k2")
    other = kb.queue.enqueue(ED, second, kb.store.revision("org-a", second).version, "o").task  # type: ignore[union-attr]
    assert kb.queue.claim(live) is not None
    recovered = KnowledgeBase(tmp_path, index=kb.index, embedder=HashingEmbedder()).queue.recover()
    assert [t.id for t in recovered] == [task.id]
    assert kb.store.task("org-a", other.id).state == "RUNNING"  # type: ignore[union-attr]
    resumed = kb.store.task("org-a", task.id)
    assert resumed is not None and resumed.state == "QUEUED" and resumed.step == "resumed"
    again = kb.queue.claim("me")
    assert again is not None and again.id == task.id and again.attempts == 2
    kb.process_task(again)
    assert kb.store.revision("org-a", rev_id).state == "PROCESSED"  # type: ignore[union-attr]


def test_a_task_interrupted_too_often_fails_cleanly(tmp_path: Path) -> None:
    import socket

    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version)  # type: ignore[union-attr]
    for _ in range(MAX_ATTEMPTS):
        assert kb.queue.claim(f"{socket.gethostname()}:{_dead_pid()}:x") is not None
        kb.queue.recover()
    task = kb.store.tasks_of("org-a", rev_id)[0]
    assert task.state == "FAILED" and task.error_category == "interrupted"
    assert kb.store.revision("org-a", rev_id).state == "FAILED"  # type: ignore[union-attr]


async def test_worker_runs_queued_tasks_in_the_background(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    kb.worker.start()
    try:
        kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version)  # type: ignore[union-attr]
        kb.worker.wake()
        for _ in range(200):
            if kb.store.revision("org-a", rev_id).state == "PROCESSED":  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)
        assert kb.store.revision("org-a", rev_id).state == "PROCESSED"  # type: ignore[union-attr]
    finally:
        await kb.worker.stop()


def test_reconcile_drops_orphans_requeues_missing_and_is_idempotent(tmp_path: Path) -> None:
    index = MemoryIndex()
    kb = _kb(tmp_path, index)
    rev_id = _approved(kb)
    kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version)  # type: ignore[union-attr]
    _run_all(kb)
    n = kb.store.revision("org-a", rev_id).chunk_count  # type: ignore[union-attr]
    # drift: an orphan revision in the index, and the processed one lost
    staged = index._chunks[("org-a", rev_id)]
    index._chunks[("org-b", "rev_orphan")] = [
        replace(c, org="org-b", revision_id="rev_orphan") for c in staged
    ]
    index.drop_revision("org-a", rev_id)
    own = kb.reconcile("org-a", "test")  # org-b's drift is not org-a's to see or repair
    assert own.dropped == {} and rev_id in own.requeued
    report = kb.reconcile(None, "test")
    assert report.dropped == {"rev_orphan": n} and report.already_queued == [rev_id]
    again = kb.reconcile(None, "test")
    assert again.dropped == {} and again.requeued == {} and again.already_queued == [rev_id]
    _run_all(kb)
    assert index.revision_counts("org-a") == {("org-a", rev_id): n}
    assert kb.store.revision("org-a", rev_id).state == "PROCESSED"  # type: ignore[union-attr]
    final = kb.reconcile("org-a", "test")
    assert final.dropped == {} and final.requeued == {} and final.already_queued == []


def test_a_cancelled_task_never_strands_its_revision(tmp_path: Path) -> None:
    """Nothing lost on failure: a failed task retried and cancelled before it ran left its
    revision FAILED with no way out (RetryTask refused a CANCELLED task, ProcessRevision a
    FAILED revision), and one queued again after a crash and cancelled left it PROCESSING
    for good. A cancelled task is retried, and a PROCESSING revision becomes FAILED."""
    import socket

    embedder = FailingEmbedder("request timed out")
    kb = _kb(tmp_path, embedder=embedder)
    rev_id = _approved(kb)
    task = kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version).task  # type: ignore[union-attr]
    _run_all(kb)
    failed = kb.store.task("org-a", task.id)
    assert failed is not None and failed.state == "FAILED"
    queued = kb.queue.retry(ED, task.id, failed.version)
    cancelled = kb.queue.cancel(ED, task.id, queued.version)
    assert kb.store.revision("org-a", rev_id).state == "FAILED"  # type: ignore[union-attr]
    embedder.fail = False
    kb.queue.retry(ED, task.id, cancelled.version)
    _run_all(kb)
    assert kb.store.revision("org-a", rev_id).state == "PROCESSED"  # type: ignore[union-attr]
    # Queued again after a crash (revision PROCESSING), then cancelled.
    second = _approved(kb, "k2")
    crashed = kb.queue.enqueue(ED, second, kb.store.revision("org-a", second).version).task  # type: ignore[union-attr]
    assert kb.queue.claim(f"{socket.gethostname()}:{_dead_pid()}:abcd") is not None
    recovered = KnowledgeBase(tmp_path, index=kb.index, embedder=HashingEmbedder()).queue.recover()
    assert [t.id for t in recovered] == [crashed.id]
    assert kb.store.revision("org-a", second).state == "PROCESSING"  # type: ignore[union-attr]
    stopped = kb.queue.cancel(ED, crashed.id, kb.store.task("org-a", crashed.id).version)  # type: ignore[union-attr]
    revision = kb.store.revision("org-a", second)
    assert revision is not None and revision.state == "FAILED" and revision.failure == "cancelled"
    kb.queue.retry(ED, crashed.id, stopped.version)
    _run_all(kb)
    assert kb.store.revision("org-a", second).state == "PROCESSED"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "body"),
    [("empty.md", b""), ("blank.txt", b"   \n\n  \t\n"), ("front.md", b"---\ntitle: x\n---\n")],
)
def test_a_revision_without_text_fails_instead_of_publishing_nothing(
    tmp_path: Path, name: str, body: bytes
) -> None:
    """A source with no text (empty, a scan without a text layer) was PROCESSED with 0
    chunks and could be published over a real release, which then answered nothing. The
    task fails with ``no_text`` and the revision cannot be published."""
    kb = _kb(tmp_path)
    wf = kb.workflow
    topic = wf.create_topic(ED, "x", "X")
    rev = wf.create_revision(ED, topic.id, "1")
    part = kb.store.upload_dir / "up_x.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(body)
    sha, size = kb.store.keep_blob(part)
    rev, _ = wf.add_file_source(
        ED, rev.id, rev.version, file_name=name, media_type="", sha256=sha, size=size
    )
    rev = wf.submit(ED, rev.id, rev.version)
    rev = wf.approve(REV, rev.id, rev.version)
    task = kb.queue.enqueue(ED, rev.id, rev.version).task
    _run_all(kb)
    out = kb.store.task("org-a", task.id)
    assert out is not None and (out.state, out.error_category) == ("FAILED", "no_text")
    assert kb.store.revision("org-a", rev.id).state == "FAILED"  # type: ignore[union-attr]


def test_a_worker_that_lost_its_task_writes_nothing_more(tmp_path: Path) -> None:
    """A task recovered from a worker (its lease ran out) and claimed by another: the
    first one's late outcome was written over the second's run, so the task said FAILED
    while its revision was PROCESSED. Outcomes are written by the owner only."""
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version)  # type: ignore[union-attr]
    first = kb.queue.claim("host:1:first")
    assert first is not None
    with kb.store.tx() as c:  # its lease ran out (a step longer than the lease, a pause)
        c.execute("UPDATE tasks SET lease_until = 0 WHERE id = ?", (first.id,))
    assert [t.id for t in kb.queue.recover()] == [first.id]
    second = kb.queue.claim("host:1:second")
    assert second is not None and second.id == first.id
    kb.queue.fail(first, "converter_timeout", "late")
    kb.queue.progress(first, "embed", 1, 2)
    assert not kb.queue.renew(first)
    row = kb.store.task("org-a", first.id)
    assert row is not None and (row.state, row.owner, row.step) == (
        "RUNNING",
        second.owner,
        "start",
    )
    kb.process_task(second)
    done = kb.store.task("org-a", first.id)
    assert done is not None and done.state == "SUCCEEDED"
    assert kb.store.revision("org-a", rev_id).state == "PROCESSED"  # type: ignore[union-attr]


def test_a_step_longer_than_the_lease_is_not_run_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease was renewed only between steps: a conversion longer than it (Docling
    may take minutes) looked like a dead worker's task, and another serving process ran
    it a second time. The worker now renews it while the step runs, from a thread of its
    own: with the event loop's shared threads all busy (operator streams hold them for
    minutes), renewals queued behind them never came."""
    from knowledge_server.kb import tasks as tasks_mod

    monkeypatch.setattr(tasks_mod, "LEASE_SECONDS", 0.6)
    # Seen from another serving process, this one is alive: only its lease can tell.
    monkeypatch.setattr(tasks_mod, "_owner_gone", lambda owner: False)
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    task = kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version).task  # type: ignore[union-attr]
    other = KnowledgeBase(tmp_path, index=kb.index, embedder=HashingEmbedder())
    recovered: list[object] = []

    def slow(claimed: object) -> None:
        import time

        for _ in range(8):  # one long step, four leases long, while another process looks
            time.sleep(0.3)
            recovered.extend(other.queue.recover())
        kb.process_task(claimed)  # type: ignore[arg-type]

    async def run() -> None:
        import time
        from concurrent.futures import ThreadPoolExecutor

        shared = ThreadPoolExecutor(max_workers=2)
        asyncio.get_running_loop().set_default_executor(shared)
        worker = tasks_mod.Worker(kb.queue, slow, poll_seconds=0.05)
        worker.start()
        await asyncio.sleep(0.2)  # claimed; then the loop's shared threads are all taken
        hold = asyncio.gather(*(asyncio.to_thread(time.sleep, 3) for _ in range(2)))
        await _until_ended(kb, task.id)
        await hold
        await worker.stop()

    asyncio.run(run())
    done = kb.store.task("org-a", task.id)
    assert recovered == []
    assert done is not None and (done.state, done.attempts) == ("SUCCEEDED", 1)


def test_a_task_its_worker_could_not_finish_is_taken_up_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write error while a task ended (a full disk) left it RUNNING until the server
    restarted: recovery ran only when a worker started. An idle worker now recovers
    tasks whose lease ran out, so the task runs again and ends."""
    from knowledge_server.kb import tasks as tasks_mod

    monkeypatch.setattr(tasks_mod, "LEASE_SECONDS", 0.3)
    monkeypatch.setattr(tasks_mod, "RECOVER_SECONDS", 0.2)
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    task = kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version).task  # type: ignore[union-attr]
    runs: list[int] = []

    def crash_once(claimed: object) -> None:
        runs.append(1)
        if len(runs) == 1:
            raise OSError(28, "No space left on device")
        kb.process_task(claimed)  # type: ignore[arg-type]

    async def run() -> None:
        worker = tasks_mod.Worker(kb.queue, crash_once, poll_seconds=0.05)
        worker.start()
        await _until_ended(kb, task.id)
        await worker.stop()

    asyncio.run(run())
    done = kb.store.task("org-a", task.id)
    assert len(runs) == 2
    assert done is not None and (done.state, done.attempts) == ("SUCCEEDED", 2)


def test_a_heartbeat_after_recovery_read_the_tasks_keeps_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery judged the leases on the rows it had read before it wrote: a renewal that
    came in between did not save the task, which was queued again beside its live run.
    The lease is judged again in the transaction that re-queues."""
    from knowledge_server.kb import tasks as tasks_mod

    monkeypatch.setattr(tasks_mod, "_owner_gone", lambda owner: False)  # another process
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version)  # type: ignore[union-attr]
    claimed = kb.queue.claim("host:1:live")
    assert claimed is not None
    with kb.store.tx() as c:  # a late heartbeat: the lease has just run out
        c.execute("UPDATE tasks SET lease_until = 0 WHERE id = ?", (claimed.id,))
    listed = kb.store.tasks_in_state

    def then_a_beat(state: str) -> object:
        rows = listed(state)
        assert kb.queue.renew(claimed)  # the heartbeat lands after the list was read
        return rows

    monkeypatch.setattr(kb.store, "tasks_in_state", then_a_beat)
    assert kb.queue.recover() == []
    row = kb.store.task("org-a", claimed.id)
    assert row is not None and (row.state, row.owner) == ("RUNNING", "host:1:live")


def test_a_worker_started_again_never_runs_its_own_task_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose loop ended while its task still ran on the task thread, started
    again on a new loop: its recovery took the task for a dead process's (the owner is
    this process) and ran it a second time. Its heartbeat also went on after the work had
    ended, renewing the lease for ever, and the task thread outlived the worker."""
    import threading
    import time

    from knowledge_server.kb import tasks as tasks_mod

    monkeypatch.setattr(tasks_mod, "LEASE_SECONDS", 0.3)
    before = set(threading.enumerate())
    kb = _kb(tmp_path)
    rev_id = _approved(kb)
    task = kb.queue.enqueue(ED, rev_id, kb.store.revision("org-a", rev_id).version).task  # type: ignore[union-attr]
    runs: list[int] = []

    def slow(claimed: object) -> None:
        runs.append(1)
        time.sleep(1.0)
        kb.process_task(claimed)  # type: ignore[arg-type]

    worker = tasks_mod.Worker(kb.queue, slow, poll_seconds=0.05)

    async def briefly() -> None:
        worker.start()
        await asyncio.sleep(0.3)  # claimed, running on the task thread
        await worker.stop()

    async def longer() -> None:
        worker.start()
        await asyncio.sleep(2.0)
        await worker.stop()

    asyncio.run(briefly())
    asyncio.run(longer())
    for _ in range(50):
        row = kb.store.task("org-a", task.id)
        if row is not None and row.state == "SUCCEEDED":
            break
        time.sleep(0.1)
    assert len(runs) == 1
    done = kb.store.task("org-a", task.id)
    assert done is not None and (done.state, done.attempts) == ("SUCCEEDED", 1)
    time.sleep(0.3)
    left = [
        t.name
        for t in threading.enumerate()
        if t not in before and t.name.startswith(("kb-lease", "kb-task"))
    ]
    assert left == []
