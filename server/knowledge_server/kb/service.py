"""The knowledge base of one serving process: its metadata store, rules, PROCESS queue and
worker, the retrieval index it stages into, and the reads the retrieve side uses.

The retrieval index is a port (``RetrievalIndex`` in ``kb/index/port.py``); this module
needs only the part of it that processing and reconcile use (``StagingIndex``, structurally
the same methods). Readers decide visibility by passing :meth:`published_revision_ids`:
staged chunks of a revision nobody published are in the index but never asked for.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from knowledge_server.code.embed import Embedder, EmbeddingError, same_embedder
from knowledge_server.kb import pipeline
from knowledge_server.kb.convert import Converter
from knowledge_server.kb.index.port import index_chunks
from knowledge_server.kb.store import KBStore, TaskRow
from knowledge_server.kb.tasks import TaskQueue, Worker
from knowledge_server.kb.workflow import INDEXED_STATES, Workflow
from knowledge_server.logs import get_logger

__all__ = ["KnowledgeBase", "ReconcileReport", "StagingIndex"]

log = get_logger("knowledge.kb")

# Largest uploaded file (bytes); a bigger one is refused while it is uploaded.
MAX_SOURCE_BYTES = 32 * 1024 * 1024
# An upload not finished within this long is forgotten (its part file removed).
UPLOAD_TTL_SECONDS = 24 * 3600.0


class StagingIndex(Protocol):
    """What processing and reconcile call on the retrieval index (a subset of
    ``RetrievalIndex``; synchronous, called in worker threads)."""

    def stage(
        self,
        org: str,
        revision_id: str,
        chunks: Sequence[Any],
        vectors: Sequence[Sequence[float]],
    ) -> None: ...

    def drop_revision(self, org: str, revision_id: str) -> int: ...

    def revision_counts(self, org: str | None = None) -> dict[tuple[str, str], int]: ...

    def warm(self, org: str | None = None, *, wait: bool = False) -> None: ...

    def close(self) -> None: ...


@dataclass
class ReconcileReport:
    """What a reconcile found and repaired: chunks of revisions nobody needs dropped
    (revision id -> chunks), revisions whose chunks were missing or incomplete, or whose
    vectors another embedder made, queued again (revision id -> task id), and those
    already queued."""

    dropped: dict[str, int] = field(default_factory=dict)
    requeued: dict[str, str] = field(default_factory=dict)
    already_queued: list[str] = field(default_factory=list)
    checked: int = 0


class _TaskFailed(Exception):
    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


class KnowledgeBase:
    """Everything the knowledge base needs in a serving process. ``index`` None: the
    metadata operations work, processing fails its tasks with ``no_index``."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        index: StagingIndex | None,
        embedder: Embedder,
        max_source_bytes: int = MAX_SOURCE_BYTES,
        poll_seconds: float = 0.5,
        converter: Converter | None = None,
    ) -> None:
        self.store = KBStore(data_dir)
        # The local converters, and Docling Serve when the configuration names one.
        self.converter = converter or Converter()
        self.workflow = Workflow(self.store)
        self.queue = TaskQueue(self.store)
        self.index = index
        self.embedder = embedder
        self.max_source_bytes = max_source_bytes
        self.worker = Worker(
            self.queue, self.process_task, poll_seconds=poll_seconds, on_start=self.sweep_uploads
        )

    def close(self) -> None:
        self.worker.halt()
        if self.index is not None:
            self.index.close()
        self.store.close()

    def sweep_uploads(self, older_than_s: float = UPLOAD_TTL_SECONDS) -> int:
        """Forget uploads not finished within ``older_than_s`` (their rows and part
        files); runs when the worker starts. Returns how many went."""
        cutoff = (datetime.now(UTC) - timedelta(seconds=older_than_s)).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        )
        with self.store.tx() as c:
            stale = [
                str(r[0])
                for r in c.execute("SELECT id FROM uploads WHERE created_at < ?", (cutoff,))
            ]
            c.execute("DELETE FROM uploads WHERE created_at < ?", (cutoff,))
        for upload_id in stale:
            self.store.upload_part(upload_id).unlink(missing_ok=True)
        return len(stale)

    # -- reads for the retrieve side ----------------------------------------------------------
    def published_revision_ids(self, org: str) -> frozenset[str]:
        """The revisions readers of ``org`` may see now (one per released topic)."""
        return self.store.published_revision_ids(org)

    # -- processing (a worker thread) ----------------------------------------------------------
    def process_task(self, task: TaskRow) -> None:
        """Run one claimed task to its end: convert, chunk, embed, stage; then PROCESSED
        (or, for RESTAGE, the chunk count recorded). Any failure fails the task with a
        category and leaves every release as it was."""
        started = time.perf_counter()
        try:
            chunks, model, redacted = self._stage(task)
        except _TaskFailed as exc:
            self.queue.fail(task, exc.category, str(exc))
            log.info("kb.task_failed", task_id=task.id, category=exc.category)
            return
        except Exception as exc:  # noqa: BLE001 - any failure ends the task, never the worker
            self.queue.fail(task, "internal", type(exc).__name__)
            log.error(
                "kb.task_failed",
                task_id=task.id,
                category="internal",
                error_type=type(exc).__name__,
            )
            return
        self.queue.succeed(task, chunks, model, redacted)
        log.info(
            "kb.task_done",
            task_id=task.id,
            chunks=chunks,
            secrets_redacted=redacted,
            ms=round((time.perf_counter() - started) * 1000, 1),
        )

    def _stage(self, task: TaskRow) -> tuple[int, str, int]:
        """Convert, chunk, redact, embed and stage the task's revision: its chunk count,
        the embedder's identity and how many secrets were replaced."""
        org = task.org
        index = self.index
        if index is None:
            raise _TaskFailed("no_index", "no retrieval index is configured on this server")
        rev = self.store.revision(org, task.revision_id)
        if rev is None:
            raise _TaskFailed("missing_revision", "the revision is gone")
        topic = self.store.topic(org, rev.topic_id)
        title = topic.title if topic else ""
        sources = self.store.sources(org, rev.id)
        per_source: list[tuple[str, list[pipeline.SourceChunk]]] = []
        redacted = 0
        for i, src in enumerate(sources):
            self.queue.progress(task, "convert", i, len(sources))
            source = pipeline.SourceInput(
                source_id=src.id,
                kind=src.kind,
                file_name=src.file_name,
                media_type=src.media_type,
                path=self.store.blob_path(src.sha256) if src.kind == "file" else None,
                question=src.question,
                answer=src.answer,
            )
            try:
                document = pipeline.convert_source(source, title, self.converter)
            except pipeline.ConversionError as exc:
                raise _TaskFailed(exc.category, f"source {src.ordinal}: {exc}") from None
            clean, n = pipeline.redacted(document)
            redacted += n
            per_source.append((src.id, pipeline.chunk_document(clean)))
        chunks = index_chunks(
            org=org,
            topic_id=rev.topic_id,
            revision_id=rev.id,
            tags=rev.tags,
            sources=per_source,
        )
        if not chunks:
            # Published, it would replace the topic's release with nothing retrievable.
            raise _TaskFailed(
                "no_text",
                "the sources hold no text (empty, or a scan without a text layer)",
            )
        self.queue.progress(task, "chunk", len(sources), len(sources), len(chunks))
        vectors = self._embed(task, chunks)
        self.queue.progress(task, "stage", len(chunks), len(chunks), len(chunks))
        try:
            index.stage(org, rev.id, chunks, vectors)
        except Exception as exc:  # noqa: BLE001 - any index failure is the task's, with its category
            raise _TaskFailed("index", f"staging failed ({type(exc).__name__})") from None
        return len(chunks), self.embedder.identity, redacted

    def _embed(self, task: TaskRow, chunks: Sequence[pipeline.Chunk]) -> list[list[float]]:
        """Embed in the embedder's batches; one ``embed_calls`` row per call (model,
        count, latency, failure category; never the text)."""
        out: list[list[float]] = []
        batch = max(1, int(getattr(self.embedder, "batch_size", 64) or 64))
        model = self.embedder.identity
        for at in range(0, len(chunks), batch):
            texts = [c.text for c in chunks[at : at + batch]]
            started = time.perf_counter()
            try:
                rows = self.embedder.embed(texts)
            except EmbeddingError as exc:
                ms = (time.perf_counter() - started) * 1000
                category = "embed_timeout" if "timed out" in str(exc).lower() else "embed_failed"
                self.queue.record_embed_call(task, model, len(texts), ms, category)
                raise _TaskFailed(category, "the embedding service failed") from None
            ms = (time.perf_counter() - started) * 1000
            self.queue.record_embed_call(task, model, len(texts), ms)
            out.extend([float(x) for x in row] for row in rows)
            self.queue.progress(task, "embed", at + len(texts), len(chunks), len(chunks))
        return out

    # -- reconcile ----------------------------------------------------------------------------
    def reconcile(self, org: str | None, by: str) -> ReconcileReport:
        """Compare the metadata with the index and repair the drift: drop chunks of
        revisions that need none, queue a RESTAGE of those whose chunks are missing or
        incomplete or whose vectors another embedder made. Idempotent: a second run finds nothing more to do (or what is queued)."""
        report = ReconcileReport()
        if self.index is None:
            return report
        counts = self.index.revision_counts(org)
        indexed = self.store.revisions_in_states(org, INDEXED_STATES)
        wanted = {(r.org, r.id): r.chunk_count for r in indexed}
        # Vectors another embedder made (the server's embedder changed) are staged again
        # with this one: retrieval leaves such revisions out until then. The same model
        # and dimension at another address is no other embedder (``same_embedder``).
        identity = self.embedder.identity
        other_embedder = {
            (r.org, r.id) for r in indexed if not same_embedder(r.embed_model, identity)
        }
        report.checked = len(wanted)
        for (r_org, rev_id), n in sorted(counts.items()):
            if (r_org, rev_id) not in wanted and not self._processing(r_org, rev_id):
                report.dropped[rev_id] = self.index.drop_revision(r_org, rev_id) or n
        for (r_org, rev_id), expected in sorted(wanted.items()):
            stale = (r_org, rev_id) in other_embedder
            if stale or counts.get((r_org, rev_id), 0) != expected:
                task = self.queue.enqueue_restage(r_org, rev_id, by)
                if task is None:
                    report.already_queued.append(rev_id)
                else:
                    report.requeued[rev_id] = task.id
        if report.requeued:
            self.worker.wake()
        return report

    def _processing(self, org: str, revision_id: str) -> bool:
        rev = self.store.revision(org, revision_id)
        return rev is not None and rev.state == "PROCESSING"
