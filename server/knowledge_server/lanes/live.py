"""Live ingest in a process of its own (the episodes lane's ``follow``).

The serving process answers searches on its event loop, one Python thread at a time. A
live ingest run in a thread beside it holds that interpreter for its parse and its
Python work around each SQLite call, and each time the search hands the interpreter
over (every SQLite call does) it may wait for the ingest to give it back. So the watcher
and the ingests run in a child process started with ``spawn``: it watches the log
folders, ingests each batch of changes into the same SQLite file under the store's
writer lock (``WriterLock``, a file lock across processes), and sends the serving
process one short message per batch. The serving process only reads those messages
(logging them and keeping errors for ``GetStatus``); its searches see a new revision
through the store's ``index_rev`` as any reader does.

The child stops when the serving process closes its end of the control pipe (stop,
shutdown, or the serving process died: the kernel closes the pipe then too).

Each batch that wrote (or failed to) is an ``ingest`` event in the audit log, appended by
the child as the start-up ingest's is: principal ``local``, the changed files and the new
``index_rev`` as targets (docs/audit.md).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from watchfiles._rust_notify import RustNotify

from knowledge_server.audit import AuditLog
from knowledge_server.auth_model import LOCAL_PRINCIPAL
from knowledge_server.episodes.ingest import ingest, ingest_changed
from knowledge_server.episodes.model import IngestReport
from knowledge_server.episodes.store import EpisodeStore
from knowledge_server.errors import KnowledgeError
from knowledge_server.lanes.common import StorageErrors, WriterLock

__all__ = [
    "FOLLOW_DEBOUNCE_MS",
    "FOLLOW_MIN_GAP_MS",
    "FOLLOW_STEP_MS",
    "Batch",
    "follow_main",
]

# A batch of changes is ingested once no new change came for FOLLOW_STEP_MS (a harness
# writes one turn as several appends), and at the latest FOLLOW_DEBOUNCE_MS after its
# first change; and no sooner than FOLLOW_MIN_GAP_MS after the previous batch began, the
# changes made meanwhile joining it: a harness that keeps writing is ingested once a
# second, not once per append (each batch is a new index revision, which starts the
# episodes lane's per-revision memos and cached answers afresh). A record waits at most
# about FOLLOW_MIN_GAP_MS plus the ingest itself.
FOLLOW_STEP_MS = 250
FOLLOW_DEBOUNCE_MS = 1000
FOLLOW_MIN_GAP_MS = 1000
# How long the watcher blocks in the notification library before it looks at the stop
# flag again (the library also looks at it every FOLLOW_STEP_MS).
RUST_TIMEOUT_MS = 1000

# Messages from the child, each a tuple whose first item names it:
#   ("watching", roots, pid)                 the notifications are set up
#   ("batch", Batch)                         one batch ingested (or failed)
#   ("stopped", error_type)                  the watcher failed and the child ends
Batch = tuple[int, int, int, str, float, str, str, str]
"""(files_changed, events_added, events_removed, index_rev, ms, last file error,
failure error type or "", storage-full message or "")."""


def _stop_when_closed(control: Connection, stop: threading.Event) -> None:
    """Set ``stop`` when the serving process closes the control pipe or says stop."""
    try:
        control.recv()
    except (EOFError, OSError):
        pass
    stop.set()


def _record(audit: AuditLog, paths: Sequence[str], rev: str, outcome: str) -> str:
    """Append the ``ingest`` event of one live batch; "" or why it could not be."""
    try:
        audit.append(
            principal=LOCAL_PRINCIPAL.id,
            org=LOCAL_PRINCIPAL.organisation,
            operation="ingest",
            targets=[*paths, rev] if rev else list(paths),
            input={"paths": list(paths), "live": True},
            outcome=outcome,
        )
    except Exception as exc:  # noqa: BLE001 - reported with the batch; the watcher goes on
        return f"audit.{type(exc).__name__}"
    return ""


def _changed(report: IngestReport) -> bool:
    return bool(report.events_added or report.events_removed or report.files_reimported)


def _ingest_batch(
    store: EpisodeStore,
    lock: WriterLock,
    storage: StorageErrors,
    audit: AuditLog,
    paths: Sequence[str],
    roots: Sequence[str],
) -> Batch:
    started = time.perf_counter()
    try:
        with storage.guard("ingest"), lock:
            report = ingest_changed(store, paths, roots)
    except Exception as exc:  # noqa: BLE001 - one failed batch is reported; the watcher goes on
        ms = round((time.perf_counter() - started) * 1000, 1)
        reason = exc.reason if isinstance(exc, KnowledgeError) else "KNOWLEDGE_INTERNAL"
        failure = _record(audit, paths, "", reason) or type(exc).__name__
        return (0, 0, 0, "", ms, "", failure, storage.message)
    ms = round((time.perf_counter() - started) * 1000, 1)
    changed = _changed(report)
    failure = _record(audit, paths, report.index_rev, "ok") if changed else ""
    return (
        report.files_changed if changed else 0,
        report.events_added,
        report.events_removed,
        report.index_rev,
        ms,
        report.errors[-1] if report.errors else "",
        failure,
        storage.message,
    )


def follow_main(
    db_path: str,
    data_dir: str,
    roots: list[str],
    catch_up: bool,
    control: Connection,
    out: Connection,
) -> None:
    """The child's entry point: follow ``roots`` until ``control`` closes.

    ``catch_up``: first ingest the roots as a whole (a restarted child has missed the
    changes made while none ran; the first one follows the start-up ingest)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the serving process decides when to stop
    sys.stdout = sys.stderr  # the serving process's stdout carries its address line only
    stop = threading.Event()
    threading.Thread(target=_stop_when_closed, args=(control, stop), daemon=True).start()
    store = EpisodeStore(db_path)
    lock = WriterLock(data_dir, "episodes")
    storage = StorageErrors("episodes")
    audit = AuditLog(Path(data_dir) / "audit.sqlite")
    try:
        with RustNotify(roots, False, False, 300, True, True) as watcher:
            out.send(("watching", len(roots), os.getpid()))
            if catch_up:
                with storage.guard("ingest"), lock:
                    caught = ingest(store, roots)
                if _changed(caught):
                    _record(audit, roots, caught.index_rev, "ok")
            last = -FOLLOW_MIN_GAP_MS / 1000
            while not stop.is_set():
                raw = watcher.watch(FOLLOW_DEBOUNCE_MS, FOLLOW_STEP_MS, RUST_TIMEOUT_MS, stop)
                if isinstance(raw, str):  # "timeout", "stop" ("signal" cannot come: SIGINT ignored)
                    continue
                paths = {p for _change, p in raw}
                wait = last + FOLLOW_MIN_GAP_MS / 1000 - time.monotonic()
                if wait > 0 and not stop.wait(wait):
                    # What changed meanwhile joins this batch (1 ms steps: no more waiting).
                    more = watcher.watch(1, 1, 1, stop)
                    if not isinstance(more, str):
                        paths.update(p for _change, p in more)
                last = time.monotonic()
                batch = _ingest_batch(store, lock, storage, audit, sorted(paths), roots)
                out.send(("batch", batch))
    except (BrokenPipeError, EOFError):
        pass  # the serving process has gone
    except Exception as exc:  # noqa: BLE001 - reported to the serving process, which keeps it for GetStatus
        try:
            out.send(("stopped", type(exc).__name__))
        except OSError:
            pass
    finally:
        audit.close()
        store.close()
        out.close()
