"""The PROCESS queue: persistent tasks in ``kb.sqlite``, and the worker that runs them.

A task is enqueued with an idempotency key (the same key twice is one task, run once),
claimed by one serving process (``BEGIN IMMEDIATE``: two processes never claim the same
task), and holds a lease it renews at every progress step and, while a step runs, every
third of the lease (``Worker._run_task``); only the holder writes the task's progress and
outcome. Task states::

    QUEUED -> RUNNING -> SUCCEEDED | FAILED      FAILED, CANCELLED -> QUEUED (manual retry)
    QUEUED -> CANCELLED                          (cancel: only a task not started)

A task left RUNNING by a process that died (its process is gone from this host, or its
lease ran out) is recovered when a worker starts, and every ``RECOVER_SECONDS`` while it is
idle: queued again to resume (staging is an
idempotent replace, so a resumed task starts its steps over), or failed with the category
``interrupted`` after ``MAX_ATTEMPTS`` starts. The topic's published release is never
touched by processing: a task stages chunks that no reader sees until a publish.

Kinds: ``PROCESS`` (an approved revision: APPROVED/FAILED -> PROCESSING -> PROCESSED /
FAILED) and ``RESTAGE`` (reconcile: index a revision's chunks again, state unchanged).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from knowledge_server.auth_model import Principal
from knowledge_server.errors import IllegalTransition, InvalidRequest, NotFound, StaleVersion
from knowledge_server.kb.store import KBStore, TaskRow, must, new_id, now
from knowledge_server.kb.workflow import check_transition
from knowledge_server.logs import get_logger

__all__ = [
    "LEASE_SECONDS",
    "MAX_ATTEMPTS",
    "RECOVER_SECONDS",
    "TaskQueue",
    "Worker",
    "owner_identity",
]

log = get_logger("knowledge.kb.tasks")

LEASE_SECONDS = 60.0
# How often an idle worker recovers tasks whose lease ran out (see ``Worker._recover``).
RECOVER_SECONDS = 30.0
MAX_ATTEMPTS = 3
ACTIVE = ("QUEUED", "RUNNING")
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def owner_identity() -> str:
    """This process as a task owner: host, pid and a random part (a pid is reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _owner_gone(owner: str) -> bool:
    """Whether the process named by ``owner`` is known to be gone: same host, and no
    process with that pid (or the pid is ours under another identity: we restarted)."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True  # a previous life of this pid: our own live tasks are not RUNNING yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass(frozen=True)
class Enqueued:
    task: TaskRow
    created: bool  # False: the key named an existing task, nothing new was queued


class TaskQueue:
    """Queue operations on ``kb.sqlite`` (synchronous; run them off the event loop)."""

    def __init__(self, store: KBStore) -> None:
        self.store = store

    def get(self, who: Principal, task_id: str) -> TaskRow:
        row = self.store.task(who.organisation, task_id)
        if row is None:
            raise NotFound("task not found", metadata={"field": "task_id"})
        return row

    def enqueue(
        self, who: Principal, revision_id: str, expected_version: int, key: str = ""
    ) -> Enqueued:
        """Queue PROCESS for an APPROVED revision. ``key`` defaults to the revision and
        its version, so asking twice for the same approved revision queues one task."""
        org = who.organisation
        key = key.strip() or f"process:{revision_id}:{expected_version}"
        if len(key) > 200:
            raise InvalidRequest(
                "idempotency_key: longer than 200 characters", metadata={"field": "idempotency_key"}
            )
        with self.store.tx() as c:
            existing = self.store.task_by_key(org, key)
            if existing is not None:
                if existing.revision_id != revision_id or existing.kind != "PROCESS":
                    raise InvalidRequest(
                        "idempotency_key: already used for another operation",
                        metadata={"field": "idempotency_key"},
                    )
                return Enqueued(existing, False)
            rev = self.store.revision(org, revision_id)
            if rev is None:
                raise NotFound("revision not found", metadata={"field": "revision_id"})
            if rev.version != expected_version:
                raise StaleVersion(
                    f"revision: expected version {expected_version}, but it is at version"
                    f" {rev.version}; read it again",
                    metadata={
                        "expected_version": str(expected_version),
                        "current_version": str(rev.version),
                    },
                )
            if rev.state != "APPROVED":
                raise IllegalTransition(
                    f"revision: PROCESS needs an APPROVED revision, this one is {rev.state}"
                    + (" (retry its failed task instead)" if rev.state == "FAILED" else ""),
                    metadata={"state": rev.state, "target": "PROCESSING"},
                )
            self._refuse_active(org, revision_id)
            task_id = self._insert(c, org, revision_id, "PROCESS", key, who.id)
        return Enqueued(must(self.store.task(org, task_id), "task"), True)

    def _refuse_active(self, org: str, revision_id: str) -> None:
        for t in self.store.tasks_of(org, revision_id):
            if t.state in ACTIVE:
                raise IllegalTransition(
                    f"revision: task {t.id} for it is {t.state} already",
                    metadata={"state": t.state, "task_id": t.id},
                )

    @staticmethod
    def _insert(c: object, org: str, revision_id: str, kind: str, key: str, by: str) -> str:
        task_id = new_id("task")
        stamp = now()
        c.execute(  # type: ignore[attr-defined]
            "INSERT INTO tasks(id, org, revision_id, kind, idempotency_key, state, version,"
            " created_by, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'QUEUED', 1, ?, ?, ?)",
            (task_id, org, revision_id, kind, key, by, stamp, stamp),
        )
        return task_id

    def enqueue_restage(self, org: str, revision_id: str, by: str) -> TaskRow | None:
        """Queue a RESTAGE of a revision unless a task for it is queued or running
        (reconcile: repeating it queues nothing more). None when one is active."""
        with self.store.tx() as c:
            if any(t.state in ACTIVE for t in self.store.tasks_of(org, revision_id)):
                return None
            task_id = self._insert(
                c, org, revision_id, "RESTAGE", f"restage:{revision_id}:{new_id('k')}", by
            )
        return self.store.task(org, task_id)

    def retry(self, who: Principal, task_id: str, expected_version: int) -> TaskRow:
        with self.store.tx() as c:
            task = self.get(who, task_id)
            self._expect(task, expected_version)
            if task.state not in ("FAILED", "CANCELLED"):
                raise IllegalTransition(
                    f"task: only a FAILED or CANCELLED task is retried, this one is {task.state}",
                    metadata={"state": task.state, "target": "QUEUED"},
                )
            self._refuse_active(task.org, task.revision_id)
            c.execute(
                "UPDATE tasks SET state = 'QUEUED', step = '', done = 0, total = 0, chunks = 0,"
                " secrets_redacted = 0, attempts = 0, error_category = '', error_message = '', owner = '',"
                " version = version + 1, updated_at = ? WHERE org = ? AND id = ? AND version = ?",
                (now(), task.org, task.id, expected_version),
            )
        return self.get(who, task_id)

    def cancel(self, who: Principal, task_id: str, expected_version: int) -> TaskRow:
        with self.store.tx() as c:
            task = self.get(who, task_id)
            self._expect(task, expected_version)
            if task.state != "QUEUED":
                raise IllegalTransition(
                    f"task: only a task not started yet is cancelled, this one is {task.state}",
                    metadata={"state": task.state, "target": "CANCELLED"},
                )
            c.execute(
                "UPDATE tasks SET state = 'CANCELLED', version = version + 1, updated_at = ?"
                " WHERE org = ? AND id = ? AND version = ? AND state = 'QUEUED'",
                (now(), task.org, task.id, expected_version),
            )
            if task.kind == "PROCESS":
                # A task queued again to resume (its revision PROCESSING) leaves the revision
                # FAILED ("cancelled"), where RetryTask of this task takes it up; left
                # PROCESSING, nothing could.
                c.execute(
                    "UPDATE revisions SET state = 'FAILED', failure = 'cancelled',"
                    " version = version + 1, updated_at = ?"
                    " WHERE org = ? AND id = ? AND state = 'PROCESSING'",
                    (now(), task.org, task.revision_id),
                )
        return self.get(who, task_id)

    @staticmethod
    def _expect(task: TaskRow, expected_version: int) -> None:
        if task.version != expected_version:
            raise StaleVersion(
                f"task: expected version {expected_version}, but it is at version {task.version};"
                " read it again",
                metadata={
                    "expected_version": str(expected_version),
                    "current_version": str(task.version),
                },
            )

    # -- the worker's side -------------------------------------------------------------------
    def claim(self, owner: str) -> TaskRow | None:
        """The oldest QUEUED task, now RUNNING for ``owner`` (its revision PROCESSING);
        PROCESS tasks before RESTAGE ones (a reconcile's or an upgrade's backlog of
        restages never holds up an editor's revision)."""
        with self.store.tx() as c:
            queued = self.store.tasks_in_state("QUEUED")
            for task in sorted(queued, key=lambda t: t.kind == "RESTAGE"):
                rev = self.store.revision(task.org, task.revision_id)
                if rev is None:
                    self._finish(c, task, "FAILED", "missing_revision", "the revision is gone")
                    continue
                if task.kind == "PROCESS" and rev.state != "PROCESSING":
                    try:
                        check_transition(rev.state, "PROCESSING")
                    except IllegalTransition:
                        self._finish(
                            c,
                            task,
                            "FAILED",
                            "illegal_state",
                            f"the revision is {rev.state}, not APPROVED or FAILED",
                        )
                        continue
                    c.execute(
                        "UPDATE revisions SET state = 'PROCESSING', failure = '',"
                        " version = version + 1, updated_at = ? WHERE org = ? AND id = ?",
                        (now(), rev.org, rev.id),
                    )
                c.execute(
                    "UPDATE tasks SET state = 'RUNNING', owner = ?, lease_until = ?,"
                    " attempts = attempts + 1, step = 'start', version = version + 1,"
                    " updated_at = ? WHERE org = ? AND id = ? AND state = 'QUEUED'",
                    (owner, time.time() + LEASE_SECONDS, now(), task.org, task.id),
                )
                return must(self.store.task(task.org, task.id), "task")
        return None

    def progress(
        self, task: TaskRow, step: str, done: int, total: int, chunks: int | None = None
    ) -> None:
        with self.store.tx() as c:
            c.execute(
                "UPDATE tasks SET step = ?, done = ?, total = ?, chunks = COALESCE(?, chunks),"
                " lease_until = ?, updated_at = ? WHERE org = ? AND id = ? AND state = 'RUNNING'"
                " AND owner = ?",
                (
                    step,
                    done,
                    total,
                    chunks,
                    time.time() + LEASE_SECONDS,
                    now(),
                    task.org,
                    task.id,
                    task.owner,
                ),
            )

    def renew(self, task: TaskRow) -> bool:
        """Extend the lease of a task this worker still runs (its heartbeat while a long
        step runs: a conversion may take minutes); False when it is no longer its own."""
        with self.store.tx() as c:
            c.execute(
                "UPDATE tasks SET lease_until = ? WHERE org = ? AND id = ? AND state = 'RUNNING'"
                " AND owner = ?",
                (time.time() + LEASE_SECONDS, task.org, task.id, task.owner),
            )
            return bool(c.changes())

    def _owned(self, task: TaskRow) -> bool:
        """The task is still RUNNING for the owner that claimed it (``task.owner``): a
        worker whose task was recovered and claimed elsewhere writes nothing more."""
        row = self.store.task(task.org, task.id)
        owned = row is not None and row.state == "RUNNING" and row.owner == task.owner
        if not owned:
            log.warning("kb.task_lost", task_id=task.id)
        return owned

    def record_embed_call(
        self, task: TaskRow, model: str, texts: int, ms: float, failure: str = ""
    ) -> None:
        with self.store.tx() as c:
            c.execute(
                "INSERT INTO embed_calls(org, task_id, model, texts, ms, failure, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (task.org, task.id, model, texts, ms, failure, now()),
            )

    def succeed(self, task: TaskRow, chunks: int, model: str, secrets_redacted: int = 0) -> None:
        """The task and (for PROCESS) its revision end together: PROCESSED.
        ``secrets_redacted``: secrets replaced in the sources' text before indexing."""
        with self.store.tx() as c:
            if not self._owned(task):
                return
            if task.kind == "PROCESS":
                c.execute(
                    "UPDATE revisions SET state = 'PROCESSED', chunk_count = ?, embed_model = ?,"
                    " failure = '', version = version + 1, updated_at = ?"
                    " WHERE org = ? AND id = ? AND state = 'PROCESSING'",
                    (chunks, model, now(), task.org, task.revision_id),
                )
            else:
                c.execute(
                    "UPDATE revisions SET chunk_count = ?, embed_model = ?, updated_at = ?"
                    " WHERE org = ? AND id = ?",
                    (chunks, model, now(), task.org, task.revision_id),
                )
            c.execute(
                "UPDATE tasks SET chunks = ?, secrets_redacted = ? WHERE org = ? AND id = ?",
                (chunks, secrets_redacted, task.org, task.id),
            )
            self._finish(c, task, "SUCCEEDED", "", "")

    def fail(self, task: TaskRow, category: str, message: str) -> None:
        with self.store.tx() as c:
            if not self._owned(task):
                return
            if task.kind == "PROCESS":
                c.execute(
                    "UPDATE revisions SET state = 'FAILED', failure = ?, version = version + 1,"
                    " updated_at = ? WHERE org = ? AND id = ? AND state = 'PROCESSING'",
                    (category, now(), task.org, task.revision_id),
                )
            self._finish(c, task, "FAILED", category, message)

    @staticmethod
    def _finish(c: object, task: TaskRow, state: str, category: str, message: str) -> None:
        c.execute(  # type: ignore[attr-defined]
            "UPDATE tasks SET state = ?, step = CASE WHEN ? = 'SUCCEEDED' THEN 'done' ELSE step END,"
            " error_category = ?, error_message = ?, owner = '', lease_until = 0,"
            " version = version + 1, updated_at = ? WHERE org = ? AND id = ?",
            (state, state, category, message[:300], now(), task.org, task.id),
        )

    def recover(self, running: frozenset[str] = frozenset()) -> list[TaskRow]:
        """Tasks left RUNNING by a process that is gone: queued again to resume, or
        FAILED (``interrupted``) once they have been started ``MAX_ATTEMPTS`` times.
        ``running``: the ids of tasks the caller's own worker still runs (left alone)."""
        recovered = []
        for candidate in self.store.tasks_in_state("RUNNING"):
            if candidate.id in running:
                continue
            with self.store.tx() as c:
                # Judged again on the row as it is now, in the transaction that changes it:
                # a heartbeat that came after the list was read keeps its task.
                task = self.store.task(candidate.org, candidate.id)
                if task is None or task.state != "RUNNING" or task.owner != candidate.owner:
                    continue
                if not (_owner_gone(task.owner) or task.lease_until < time.time()):
                    continue
                if task.attempts >= MAX_ATTEMPTS:
                    self.fail(task, "interrupted", "the process running it stopped, too often")
                else:
                    c.execute(
                        "UPDATE tasks SET state = 'QUEUED', step = 'resumed', owner = '',"
                        " lease_until = 0, version = version + 1, updated_at = ?"
                        " WHERE org = ? AND id = ? AND state = 'RUNNING' AND owner = ?",
                        (now(), task.org, task.id, task.owner),
                    )
            recovered.append(task)
        return recovered


class Worker:
    """Runs queued tasks one at a time in this serving process: claims in a thread, runs
    ``process`` (blocking: conversion, embedding, staging) in a thread, and goes back to
    the queue. Woken at once by ``wake()`` (a task queued here), else it looks every
    ``poll_seconds`` (tasks queued by another serving process)."""

    def __init__(
        self,
        queue: TaskQueue,
        process: Callable[[TaskRow], None],
        *,
        poll_seconds: float = 0.5,
        on_start: Callable[[], object] | None = None,
    ) -> None:
        self.queue = queue
        self.process = process
        self.on_start = on_start
        self.poll_seconds = poll_seconds
        self.owner = owner_identity()
        # The task's own thread (made by ``_run_task``, let go by ``halt``/``stop``): never
        # queued behind the loop's other work (operator streams hold the shared pool's
        # threads for minutes).
        self._executor: ThreadPoolExecutor | None = None
        # Tasks this worker runs right now (a thread may outlive the loop that started it):
        # its own recovery never takes them, although their owner is this process.
        self._running: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start on the running loop (once; again after the previous loop ended)."""
        if self._task is not None and not self._task.done():
            return
        self._wake = asyncio.Event()
        # A context of its own: started from an RPC, it must not carry that call's
        # request id and principal into its logs.
        self._task = asyncio.get_running_loop().create_task(
            self._run(), context=contextvars.Context()
        )

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def halt(self) -> None:
        """Stop taking tasks (on closing the store): the loop task is cancelled; a task
        running in its thread finishes there or, its process gone, is recovered later."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._let_go()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._let_go()

    def _let_go(self) -> None:
        """The task thread ends when its task does (the next task makes another)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def _run(self) -> None:
        await self._recover()
        try:
            if self.on_start is not None:
                await asyncio.to_thread(self.on_start)
        except Exception as exc:  # noqa: BLE001 - the worker goes on with the queue as it is
            log.error("kb.recover_failed", error_type=type(exc).__name__)
        wake = self._wake or asyncio.Event()
        recover_at = time.monotonic() + RECOVER_SECONDS
        while True:
            if time.monotonic() >= recover_at:
                await self._recover()
                recover_at = time.monotonic() + RECOVER_SECONDS
            try:
                task = await asyncio.to_thread(self.queue.claim, self.owner)
            except Exception as exc:  # noqa: BLE001 - a busy or full store: try again later
                log.error("kb.claim_failed", error_type=type(exc).__name__)
                task = None
            if task is None:
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), timeout=self.poll_seconds)
                except TimeoutError:
                    pass
                continue
            log.info("kb.task_started", task_id=task.id, kind=task.kind, attempt=task.attempts)
            try:
                await self._run_task(task)
            except Exception as exc:  # noqa: BLE001 - e.g. a full disk while failing the task: the lease recovers it
                log.error("kb.task_crashed", task_id=task.id, error_type=type(exc).__name__)
                await asyncio.sleep(self.poll_seconds)

    async def _run_task(self, task: TaskRow) -> None:
        """``process(task)`` on this worker's own thread, its lease renewed every third of
        it meanwhile by a thread of its own: a step longer than the lease (a long
        conversion) is not taken for a dead worker's and run a second time elsewhere,
        however busy the event loop's shared threads are. The beats go on for as long as
        the work runs, also after the loop stopped waiting for it, and end with it (or
        when the task is no longer this worker's)."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(LEASE_SECONDS / 3):
                try:
                    if not self.queue.renew(task):
                        return
                except Exception as exc:  # noqa: BLE001 - a busy store: the next beat tries again
                    log.error(
                        "kb.lease_renew_failed", task_id=task.id, error_type=type(exc).__name__
                    )

        def run() -> None:
            try:
                self.process(task)
            finally:
                done.set()
                self._running.discard(task.id)

        self._running.add(task.id)
        threading.Thread(target=beat, name="kb-lease", daemon=True).start()
        if self._executor is None:  # made here, let go by halt/stop
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-task")
        try:
            running = asyncio.get_running_loop().run_in_executor(self._executor, run)
        except RuntimeError:  # let go by a halt from another thread meanwhile
            self._running.discard(task.id)
            done.set()
            raise
        await asyncio.shield(running)

    async def _recover(self) -> None:
        """Queue again the tasks whose worker is gone or whose lease ran out: at start, and
        every ``RECOVER_SECONDS`` while idle (a task this process could not finish, e.g.
        on a full disk, is taken up again without a restart)."""
        try:
            recovered = await asyncio.to_thread(self.queue.recover, frozenset(self._running))
            if recovered:
                log.info("kb.tasks_recovered", tasks=len(recovered))
        except Exception as exc:  # noqa: BLE001 - the worker goes on with the queue as it is
            log.error("kb.recover_failed", error_type=type(exc).__name__)
