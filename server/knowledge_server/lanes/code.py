"""The code & document lane (L2) behind the Lane interface, plus IndexWorkspace and GetChunk."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from knowledge_server import deadline
from knowledge_server._gen.knowledge.v1 import (
    errors_pb2,
    index_service_pb2,
    knowledge_service_pb2,
    search_pb2,
)
from knowledge_server.code import bitknn, memory
from knowledge_server.code.embed import Embedder, EmbeddingError, HashingEmbedder
from knowledge_server.code.index import CodeIndex
from knowledge_server.code.model import (
    ChunkRecord,
    CodeHit,
    CodeSearchResult,
    Freshness,
    IndexInterrupted,
    IndexOptions,
)
from knowledge_server.code.search import check_freshness
from knowledge_server.code.store import is_binary, vec_table_for
from knowledge_server.code.walker import RootOutside
from knowledge_server.errors import InvalidRequest, NotFound, PermissionDenied, Unavailable
from knowledge_server.lanes.common import (
    Pool,
    ProgressFn,
    StorageErrors,
    WriterLock,
    bound_store,
    finish_kept,
    operation_summary,
    run_bounded,
)
from knowledge_server.schema import snapshot
from knowledge_server.search.lanes import (
    INDEX_EMPTY,
    NO_MATCH,
    NOT_INDEXED,
    LaneQuery,
    LaneResult,
    degraded,
)
from knowledge_server.workspaces import is_under

SOURCE = "knowledge.code"
DB_FILE = "code.sqlite"
FRESHNESS_INTERVAL_S = 15.0
DOC_LANGUAGES = frozenset({"markdown", "text", "txt", "rst", "adoc", "asciidoc", "org"})


# mode=docs|themes answered by text match only (no document graph in this answer).
DOCS_PLAIN_REASON = (
    "KNOWLEDGE_LANE_DEGRADED: mode=docs answers from document chunks by lexical and vector match; "
    "no document graph answered (not built, or not licensed)"
)
DOCS_PLAIN_MESSAGE = "mode=docs: no document graph answered; plain retrieval"


def _visible(workspace: str, scope: tuple[str, ...] | None) -> bool:
    """An indexed workspace is visible when it lies in the scope. A scope root inside it (a
    sub-folder) does not make it visible: searches filter by workspace root, so such a
    scope sees none of it, and neither GetChunk nor GetStatus may show more than a search."""
    return scope is None or any(is_under(workspace, r) for r in scope)


def _why_empty(idx: CodeIndex, scoped: Sequence[str]) -> str:
    """Why a search found nothing: no indexed workspace in the caller's scope, only empty
    revisions there (no file gave a chunk), or no match in what is there."""
    if not scoped:
        return NOT_INDEXED
    marks = ",".join("?" * len(scoped))
    row = idx.conn.execute(
        "SELECT COALESCE(SUM(r.chunks), 0) FROM workspaces w JOIN revisions r"  # noqa: S608 - placeholders only, values bound
        f" ON r.id = w.current_rev_id WHERE w.root IN ({marks})",
        list(scoped),
    ).fetchone()
    return NO_MATCH if row and int(row[0]) > 0 else INDEX_EMPTY


class CodeLane:
    name = "code"

    def __init__(
        self,
        data_dir: Path,
        *,
        embedder: Embedder | None = None,
        options: IndexOptions | None = None,
    ) -> None:
        self.path = str(data_dir / DB_FILE)
        self.embedder = embedder
        # Only the built-in hashing embedder embeds a query in microseconds, in process.
        self._query_off_loop = embedder is not None and not isinstance(embedder, HashingEmbedder)
        # In-process chunking: the server never forks worker processes next to gRPC threads.
        self.options = options or IndexOptions(workers=1)
        self._writer = CodeIndex(self.path, embedder=embedder, options=self.options)
        # Searches here build the store's copy in memory when it is missing or behind.
        self._db_file = self._writer.conn.filename
        memory.enable(self._db_file)
        self._write_lock = WriterLock(data_dir, "code")
        self._readers: Pool[CodeIndex] = Pool(
            lambda: bound_store(CodeIndex(self.path, embedder=embedder, options=self.options))
        )
        self.last_error = ""
        self.storage = StorageErrors(self.name)
        # Freshness is checked in the background (a walk of a large tree costs hundreds of
        # ms); a query only reads the last result, so the check is cheap at query time.
        self._fresh: dict[str, Freshness] = {}
        self._fresh_lock = threading.Lock()
        self._stop = threading.Event()
        # Set by close(): a running index stops embedding between two batches.
        self._cancel = threading.Event()
        self._fresh_thread = threading.Thread(
            target=self._freshness_loop, name="code-freshness", daemon=True
        )
        self._fresh_thread.start()

    def close(self, wait_s: float = 30.0) -> None:
        """Stop a running index between two embedding batches, wait for it to let go of
        the writer (at most ``wait_s``), then close the stores."""
        self._cancel.set()
        self._stop.set()
        self._fresh_thread.join(timeout=5)
        memory.cancel(self._db_file)
        with self._write_lock.idle(wait_s) as idle:
            self._readers.close_all(lambda s: s.close())
            if idle:
                self._writer.close()

    def refresh_freshness(self, roots: Sequence[str] | None = None) -> dict[str, Freshness]:
        """Re-check the given (default: all indexed) workspaces against the disk now."""
        with self._readers.get() as idx:
            targets = list(roots) if roots is not None else self._roots(idx)
            # ttl 0: this is the periodic check itself, its result is what queries read.
            results = {
                root: check_freshness(
                    idx.conn, root, db_key=idx.db_path, options=idx.options, ttl_s=0.0
                )
                for root in targets
            }
        with self._fresh_lock:
            self._fresh.update(results)
        return results

    def preload_vectors(self) -> int:
        """Load the in-memory copy of the binary vectors (code.bitknn) if it is missing or
        behind the store, so the first query after a start or an index run does not pay
        for reading every vector. Returns the vectors held."""
        emb = self.embedder
        if emb is None or not is_binary(emb.dim):
            return 0
        with self._readers.get() as idx:
            vtbl = vec_table_for(idx.conn, emb.identity, emb.dim, create=False)
            return bitknn.preload(idx.conn, vtbl, emb.dim) if vtbl else 0

    def preload_memory(self, wait: bool = False) -> None:
        """Start (``wait``: and finish) building this process's copy of the store's
        full-text tables (code.memory) if it is missing or behind the store: searches are
        answered by SQL until it is there."""
        with self._readers.get() as idx:
            memory.warm(idx.conn, wait=wait)

    def _freshness_loop(self) -> None:
        while True:
            try:
                self.preload_vectors()
            except Exception as exc:  # noqa: BLE001 - queries load it themselves then
                self.last_error = f"vector preload failed: {type(exc).__name__}"
            try:
                self.preload_memory()
            except Exception as exc:  # noqa: BLE001 - searches build it themselves then
                self.last_error = f"memory preload failed: {type(exc).__name__}"
            try:
                self.refresh_freshness()
            except Exception as exc:  # noqa: BLE001 - freshness must never take the lane down
                self.last_error = f"freshness check failed: {type(exc).__name__}"
            if self._stop.wait(FRESHNESS_INTERVAL_S):
                return

    def freshness(self, roots: Sequence[str]) -> dict[str, Freshness]:
        with self._fresh_lock:
            return {r: self._fresh[r] for r in roots if r in self._fresh}

    @staticmethod
    def _roots(idx: CodeIndex) -> list[str]:
        return idx.indexed_roots()

    # -- documents for other layers (the document graph) --------------------------------
    def indexed_roots(self) -> list[str]:
        """The workspaces that have a current revision, in root order."""
        with self._readers.get() as idx:
            return idx.indexed_roots()

    def document_chunks(self, root: str, languages: Sequence[str]) -> tuple[str, list[ChunkRecord]]:
        """The current revision of ``root`` and its chunks in ``languages``
        (``CodeIndex.document_chunks``): other layers read this store only through here."""
        with self._readers.get() as idx:
            return idx.document_chunks(root, languages)

    # -- search ------------------------------------------------------------------------
    def _search_sync(self, q: LaneQuery) -> LaneResult:
        with self._readers.get() as idx, snapshot(idx.conn):
            roots = self._roots(idx)
            if not roots:
                return degraded(
                    self.name, "KNOWLEDGE_INDEX_NOT_READY", "no workspace has been indexed yet"
                )
            lane = search_pb2.CodeLane(source=SOURCE, capability="full")
            if q.workspaces == ():
                lane.empty_reason = NOT_INDEXED
                return LaneResult(lane=lane)
            provider_down = ""
            for mode in ("hybrid", "lexical"):
                try:
                    result = idx.search(
                        q.query,
                        workspaces=q.workspaces,
                        path_prefixes=list(q.paths) or None,
                        # Documents are a minority of chunks: look deeper, then keep documents only.
                        limit=q.top_k * 4 if q.docs_only else q.top_k,
                        mode=mode,
                        snippet_chars=q.snippet_chars,
                        check_fresh=False,
                        describe_hits=False,  # only for the items the coordinator keeps: _finisher
                        # mode=docs asks for documents, mode=find_knowledge for knowledge:
                        # documents weigh as in a knowledge question, however the question
                        # reads (code.rank.about_code weighs only the router's guess).
                        intent=(
                            "knowledge"
                            if q.docs_only or (q.intent == "find_knowledge" and q.intent_stated)
                            else q.intent
                        ),
                    )
                    break
                except EmbeddingError as exc:
                    # The embedding provider did not embed the query: answer lexically
                    # and say so, rather than losing the whole lane.
                    provider_down = f"embedding provider unavailable ({exc}); lexical only"
            if provider_down:
                result = dataclasses.replace(
                    result, capability="degraded", degradation_reason=provider_down
                )
            scoped = [r for r in roots if _visible(r, q.workspaces)]
            if not result.hits:
                lane.empty_reason = _why_empty(idx, scoped)
        fresh = self.freshness(scoped)
        warnings: list[errors_pb2.Notice] = []
        lane.index_rev = result.index_rev
        lane.capability = result.capability
        if result.capability != "full":
            lane.degraded = True
            lane.degradation_reason = result.degradation_reason or "capability=degraded"
            warnings.append(
                errors_pb2.Notice(
                    code="KNOWLEDGE_LANE_DEGRADED", lane=self.name, message=lane.degradation_reason
                )
            )
        stale = sorted(root for root, f in fresh.items() if f.stale)
        lane.freshness.stale = bool(stale)
        lane.freshness.verified_by = "mtime" if len(fresh) == len(scoped) else "pending"
        lane.freshness.checked_at.GetCurrentTime()
        if stale:
            warnings.append(
                errors_pb2.Notice(
                    code="KNOWLEDGE_STALE_INDEX",
                    lane=self.name,
                    message=f"{len(stale)} workspace(s) changed after their revision; results are from the indexed revision",
                )
            )
        hits = result.hits
        if q.docs_only:
            hits = [h for h in hits if h.language in DOC_LANGUAGES][: q.top_k]
            # Seed 003 §3.4: without dual-level matching, mode=docs says it is plain retrieval
            # (the document graph's search wrapper lifts this when its graph answers).
            lane.degraded = True
            reason = DOCS_PLAIN_REASON
            lane.degradation_reason = (
                f"{lane.degradation_reason}; {reason}" if lane.degradation_reason else reason
            )
            warnings.append(
                errors_pb2.Notice(
                    code="KNOWLEDGE_LANE_DEGRADED", lane=self.name, message=DOCS_PLAIN_MESSAGE
                )
            )
        for h in hits:
            lane.items.add(
                id=h.id,
                chunk_id=h.chunk_id,
                path=h.path,
                start_line=h.start_line,
                end_line=h.end_line,
                source_kind=h.source_kind,
                provenance=h.provenance,
                score=h.score,
                why=list(h.why),
                symbol=h.symbol,
                language=h.language,
                workspace=h.workspace,
            )
        return LaneResult(lane=lane, warnings=warnings, finish=self._finisher(result, hits, q))

    def _finisher(
        self, result: CodeSearchResult, hits: Sequence[CodeHit], q: LaneQuery
    ) -> Callable[[Sequence[search_pb2.CodeItem]], None]:
        """Snippets and "lex:" explanations for the items the coordinator kept (a third
        to a half of those ranked): reading and tokenising chunk texts is most of what an item costs."""

        def describe(wanted: list[CodeHit]) -> list[CodeHit]:
            with self._readers.get() as idx:
                return idx.describe(result, wanted, q.snippet_chars)

        def apply(items: Sequence[search_pb2.CodeItem], described: dict[str, CodeHit]) -> None:
            for it in items:
                h = described.get(it.id)
                if h is not None:
                    del it.why[:]
                    it.why.extend(h.why)
                    if q.with_text:
                        it.snippet = h.snippet

        return finish_kept(hits, describe, apply)

    def revision(self) -> tuple[object, ...]:
        """Cache key part: every workspace's current revision and its freshness state, and
        what the lane's capability depends on besides them (``code.search._scope_state``):
        the embedder each revision was built with, its chunks still without vectors, and
        whether this lane's embedder has vectors stored. Vectors filled in later keep the
        revision but change the capability, so an answer cached while they were missing
        ("vectors not ready") is not served once they are there."""
        with self._readers.get() as idx:
            emb = idx.embedder  # the lane's, or the store's default when it has none
            revs = tuple(
                idx.conn.execute(
                    "SELECT w.root, w.current_rev_id, r.embedder, r.vec_missing FROM workspaces w"
                    " LEFT JOIN revisions r ON r.id = w.current_rev_id ORDER BY w.root"
                )
            )
            vectors = (emb.identity, vec_table_for(idx.conn, emb.identity, emb.dim, create=False))
        # A remote provider's state (failures, cooling down): an answer made lexically while
        # it was down is not served from the cache once it may answer again.
        health = getattr(emb, "health", None)
        provider = health() if callable(health) else None
        with self._fresh_lock:
            fresh = tuple(sorted((r, f.stale) for r, f in self._fresh.items()))
        return revs, fresh, vectors, provider

    async def search(self, q: LaneQuery) -> LaneResult:
        if self._query_off_loop:
            # The query's embedding comes from a model or over the network: work no
            # deadline can interrupt (an HTTP endpoint may take its full timeout, with
            # retries), so it runs in the request pool. The coordinator awaits it like an
            # external lane's answer; its reads still stop at the deadline.
            return await deadline.off_loop(run_bounded, self._search_sync, q, pool="code")
        return run_bounded(self._search_sync, q)

    # -- GetChunk ------------------------------------------------------------------------
    def get_chunk_sync(
        self, chunk_id: str, scope: tuple[str, ...] | None
    ) -> knowledge_service_pb2.GetChunkResponse:
        if not chunk_id or "\x00" in chunk_id or len(chunk_id) > 200:
            raise InvalidRequest("id: expected a chunk id", metadata={"field": "id"})
        with self._readers.get() as idx:
            rec = idx.get_chunk(chunk_id)
        # Not found and not visible look the same.
        if rec is None or not _visible(rec.workspace, scope):
            raise NotFound("no such chunk")
        resp = knowledge_service_pb2.GetChunkResponse(index_rev=rec.index_rev)
        resp.chunk.CopyFrom(
            knowledge_service_pb2.Chunk(
                id="chunk:" + rec.chunk_id,
                chunk_id=rec.chunk_id,
                workspace=rec.workspace,
                path=rec.path,
                start_line=rec.start_line,
                end_line=rec.end_line,
                source_kind=rec.source_kind,
                symbol=rec.symbol,
                language=rec.language,
                text=rec.text,
                content_hash=rec.content_hash,
            )
        )
        return resp

    # -- indexing ------------------------------------------------------------------------
    def index_sync(
        self,
        root: str,
        full: bool,
        progress: ProgressFn,
        within: Callable[[str], bool] | None = None,
    ) -> index_service_pb2.OperationSummary:
        """Index ``root``; ``within`` (a scoped caller's workspaces) is asked about the real
        path of the folder the indexer opens, under the writer's lock: a root re-pointed
        after the caller's check is refused (``PermissionDenied``)."""
        with self.storage.guard("index"):
            return self._index_sync(root, full, progress, within)

    def _index_sync(
        self,
        root: str,
        full: bool,
        progress: ProgressFn,
        within: Callable[[str], bool] | None = None,
    ) -> index_service_pb2.OperationSummary:
        started = time.perf_counter()
        if not Path(root).is_dir():
            raise InvalidRequest(
                f"root: {root} is not a directory on the server", metadata={"field": "root"}
            )
        with self._write_lock:
            options = self.options
            try:
                report = self._writer.index_workspace(
                    root,
                    progress_callback=lambda d, t, p: progress("index", d, t, p),
                    vector_progress=lambda d, t, p: progress("embed", d, t, p),
                    options=options,
                    should_stop=self._cancel.is_set,
                    full=full,
                    within=within,
                )
            except IndexInterrupted as exc:
                raise Unavailable(f"the server is stopping; indexing {exc}") from None
            except RootOutside:
                raise PermissionDenied(
                    "root: outside the workspaces this principal may manage"
                ) from None
        self.refresh_freshness([report.workspace])
        summary = operation_summary(
            report,
            (
                "files_seen",
                "files_indexed",
                "files_reused",
                "chunks",
                "chunks_new",
                "vectors_embedded",
                "vectors_missing",
            ),
            index_rev=report.index_rev,
            changed=not report.unchanged,
            started=started,
        )
        summary.counters["drift_written"] = int(report.drift_written)
        for reason, n in sorted(report.files_skipped.items()):
            summary.counters[f"skipped_{reason}"] = int(n)
        if report.vectors_error:
            summary.stopped_by = "embedding_failed"  # the CLI says: run again to resume
            summary.problems.add(
                code="EMBEDDING_FAILED",
                message=f"{report.vectors_error}; the revision answers lexically until a later"
                " index run fills the missing vectors",
            )
        for lang, n in sorted(report.parse_fallbacks.items()):
            summary.problems.add(
                code="PARSE_FALLBACK", message=f"{lang}: {n} file(s) chunked by line windows"
            )
        return summary

    def status(self, scope: tuple[str, ...] | None) -> index_service_pb2.LaneStatus:
        with self._readers.get() as idx:
            roots = [r for r in self._roots(idx) if _visible(r, scope)]
            st = index_service_pb2.LaneStatus(lane=self.name, capability="full")
            revs = []
            chunks = 0
            files = 0
            for root in roots:
                rev = idx.current_rev(root) or ""
                revs.append(rev if len(roots) == 1 else f"{root}={rev}")
                known = self.freshness([root]).get(root)
                if known is not None and known.stale:
                    st.stale_workspaces.append(root)
                row = idx.conn.execute(
                    "SELECT r.chunks, r.files FROM workspaces w JOIN revisions r ON r.id = w.current_rev_id WHERE w.root = ?",
                    (root,),
                ).fetchone()
                if row:
                    chunks += int(row[0])
                    files += int(row[1])
            st.index_rev = ";".join(revs)
            st.counts["workspaces"] = len(roots)
            st.counts["chunks"] = chunks
            st.counts["files"] = files
        if not roots:
            st.degraded = True
            st.capability = "degraded"
            st.reason = "no workspace has been indexed yet"
        full = self.storage.notice()
        if full is not None:
            st.last_error.CopyFrom(full)
        return st
