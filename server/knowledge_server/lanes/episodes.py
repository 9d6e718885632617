"""The episodes lane (L1) behind the Lane interface, plus ingestion and GetEpisode."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import cast

import structlog

from knowledge_server._gen.knowledge.v1 import (
    errors_pb2,
    index_service_pb2,
    knowledge_service_pb2,
    search_pb2,
)
from knowledge_server.episodes.discover import default_roots
from knowledge_server.episodes.ingest import ingest, ingest_sample_if_empty
from knowledge_server.episodes.model import EpisodeHit, EventDetail, SessionInfo
from knowledge_server.episodes.store import DB_FILE, EpisodeStore, InvalidQuery
from knowledge_server.errors import InvalidRequest, NotFound, Unavailable
from knowledge_server.lanes.common import (
    Pool,
    ProgressFn,
    StorageErrors,
    WriterLock,
    bound_store,
    finish_kept,
    operation_summary,
    run_bounded,
    ts,
)
from knowledge_server.lanes.live import Batch, follow_main
from knowledge_server.logs import get_logger
from knowledge_server.schema import snapshot
from knowledge_server.search.lanes import (
    NO_MATCH,
    NOT_INDEXED,
    LaneQuery,
    LaneResult,
    degraded,
)
from knowledge_server.workspaces import (
    in_scope,
    is_under,
    normalise_workspace,
    really_in_scope,
)

SOURCE = "knowledge.episodes"
# Live ingest: how often a watcher process that keeps exiting is started again, a minute.
FOLLOW_RESTARTS = 3
# How long a watcher process told to stop may take (it looks at its pipe every 250 ms).
FOLLOW_STOP_S = 5.0
Scope = tuple[str, ...] | None


def workspace_of(cwd: str | None, roots: Sequence[str]) -> str:
    """The deepest configured root containing ``cwd`` (DESIGN §5), else the cwd itself."""
    if not cwd:
        return ""
    best = ""
    for root in roots:
        if is_under(cwd, root) and len(root) > len(best):
            best = root
    return best or cwd


class EpisodesLane:
    name = "episodes"

    def __init__(
        self, data_dir: Path, *, session_paths: Sequence[str] = (), workspaces: Sequence[str] = ()
    ) -> None:
        self.data_dir = data_dir
        self.path = str(data_dir / DB_FILE)
        self.session_paths = tuple(session_paths)
        self.workspaces = tuple(workspaces)
        self._writer = EpisodeStore(self.path)
        self._write_lock = WriterLock(data_dir, "episodes")
        # Set by close(): a running ingest stops before its next file.
        self._cancel = threading.Event()
        self._readers: Pool[EpisodeStore] = Pool(
            lambda: bound_store(EpisodeStore(self.path, read_only=True))
        )
        # Lane counters per (index revision, minute, scope): they change only with either.
        self._counts: dict[tuple[object, ...], dict[str, int]] = {}
        self._counts_lock = threading.Lock()
        self.last_error: str = ""
        self.storage = StorageErrors(self.name)

    def close(self, wait_s: float = 30.0) -> None:
        """Stop a running ingest between two files (each file's import is its own
        transaction), wait for it to let go of the writer (at most ``wait_s``), then close
        the stores. Closed under a running ingest, the writer refused ("busy in another
        thread"), the stores after it were never closed, and the process waited for the
        whole ingest."""
        self._cancel.set()
        with self._write_lock.idle(wait_s) as idle:
            self._readers.close_all(lambda s: s.close())
            if idle:
                self._writer.close()

    @contextmanager
    def snapshot(self) -> Iterator[EpisodeStore]:
        """A read-only view of the store for long reads outside a search (the derived
        layer's rebuild): its own connection, with no lane deadline, closed after."""
        store = EpisodeStore(self.path, read_only=True)
        try:
            yield store
        finally:
            store.close()

    # -- search ------------------------------------------------------------------------
    def _session_pb(self, s: SessionInfo) -> search_pb2.SessionInfo:
        out = search_pb2.SessionInfo(
            cwd=s.cwd or "",
            agent_preset=s.agent_preset or s.model or "",
            live=s.live,
            persisted=s.persisted,
            harness=s.harness,
            model=s.model or "",
            outcome=s.outcome,
            parent_session_id=s.parent_session_id or "",
            agent_id=s.agent_id or "",
            workspace=workspace_of(s.cwd, self.workspaces),
        )
        created = ts(s.created_at)
        if created is not None:
            out.created_at.CopyFrom(created)
        return out

    def _search_sync(self, q: LaneQuery) -> LaneResult:
        lane = search_pb2.EpisodesLane(source=SOURCE)
        with self._readers.get() as store, snapshot(store.conn):
            lane.index_rev = store.index_rev()
            counts = self._counts_of(store, lane.index_rev, q.workspaces)
            lane.counts.sessions = counts["sessions"]
            lane.counts.indexed_docs = counts["indexed_docs"]
            lane.counts.live = counts.get("live_sessions", 0)
            if self._counts_of(store, lane.index_rev, None)["sessions"] == 0:
                return degraded(
                    self.name, "KNOWLEDGE_INDEX_NOT_READY", "no session logs have been ingested yet"
                )
            if q.workspaces == () or counts["sessions"] == 0:
                # Sessions were ingested, none of them in the caller's workspaces.
                lane.empty_reason = NOT_INDEXED
                return LaneResult(lane=lane)
            try:
                hits, needles = store.search_ranked(
                    q.query,
                    k=q.top_k,
                    workspaces=q.workspaces,
                    session_ids=q.session_ids or None,
                    since=q.since,
                    until=q.until,
                    outcome=q.outcome,
                )
            except InvalidQuery:
                notice = errors_pb2.Notice(
                    code="KNOWLEDGE_INVALID_REQUEST",
                    lane=self.name,
                    message="the query has no searchable words for this lane",
                )
                lane.empty_reason = NO_MATCH
                return LaneResult(lane=lane, warnings=[notice])
        if not hits:
            lane.empty_reason = NO_MATCH
        for h in hits:
            item = lane.items.add(
                id=h.id,
                session_id=h.session_id,
                seq=h.seq,
                event_type=h.event_type,
                why=list(h.why),
                score=h.score,
            )
            t = ts(h.time)
            if t is not None:
                item.time.CopyFrom(t)
        return LaneResult(lane=lane, finish=self._finisher(hits, needles, q))

    def _finisher(
        self, hits: Sequence[EpisodeHit], needles: list[str], q: LaneQuery
    ) -> Callable[[Sequence[search_pb2.EpisodeItem]], None]:
        """Snippets, sessions and surfaces for the items the coordinator kept (a third
        to a half of those ranked), their texts and sessions read in one query."""

        def describe(wanted: list[EpisodeHit]) -> list[EpisodeHit]:
            with self._readers.get() as store:
                return store.describe(wanted, needles, q.snippet_chars)

        def apply(
            items: Sequence[search_pb2.EpisodeItem], described: dict[str, EpisodeHit]
        ) -> None:
            sessions: dict[str, search_pb2.SessionInfo] = {}  # hits often share a session
            for it in items:
                h = described.get(it.id)
                if h is None or h.session is None:
                    continue
                it.surface = "current" if h.session.live else "persisted"
                if q.with_text:
                    it.snippet = h.snippet
                pb = sessions.get(h.session_id)
                if pb is None:
                    pb = sessions[h.session_id] = self._session_pb(h.session)
                it.session.CopyFrom(pb)

        return finish_kept(hits, describe, apply)

    def _counts_of(
        self, store: EpisodeStore, rev: str, workspaces: Sequence[str] | None
    ) -> dict[str, int]:
        """``store.counts``, remembered for the revision and the current minute (the
        live-session count moves with the clock, as the cache key does)."""
        key = (rev, int(time.time() // 60), None if workspaces is None else tuple(workspaces))
        with self._counts_lock:
            hit = self._counts.get(key)
        if hit is not None:
            return hit
        counts = store.counts(workspaces)
        with self._counts_lock:
            if len(self._counts) >= 256:
                self._counts.clear()
            self._counts[key] = counts
        return counts

    def revision(self) -> tuple[str, int]:
        """Cache key part: the index revision (and the minute, which bounds how long a
        cached live/persisted flag can lag)."""
        with self._readers.get() as store:
            return store.index_rev(), int(time.time() // 60)

    async def search(self, q: LaneQuery) -> LaneResult:
        return run_bounded(self._search_sync, q)

    # -- GetEpisode ---------------------------------------------------------------------
    def _episode_pb(
        self, d: EventDetail, session: SessionInfo | None
    ) -> knowledge_service_pb2.Episode:
        out = knowledge_service_pb2.Episode(
            id=d.id,
            session_id=d.session_id,
            seq=d.seq,
            event_type=d.event_type,
            text=d.text,
            tool_name=d.tool_name or "",
            is_error=d.is_error,
        )
        t = ts(d.time)
        if t is not None:
            out.time.CopyFrom(t)
        if session is not None:
            out.session.CopyFrom(self._session_pb(session))
        return out

    def get_episode_sync(
        self, episode_id: str, neighbours: int, workspaces: tuple[str, ...] | None
    ) -> knowledge_service_pb2.GetEpisodeResponse:
        if not 0 <= neighbours <= 20:
            raise InvalidRequest(
                "neighbours: must be within 0..20", metadata={"field": "neighbours"}
            )
        with self._readers.get() as store:
            try:
                detail = store.get_event(episode_id, neighbours)
            except InvalidQuery:
                raise InvalidRequest(
                    "id: expected ep:<session_id>:<seq>", metadata={"field": "id"}
                ) from None
            rev = store.index_rev()
        # Not found and not visible look the same: no hint that another workspace has it.
        if detail is None or not in_scope(
            detail.session.cwd if detail.session else None, workspaces
        ):
            raise NotFound("no such episode")
        resp = knowledge_service_pb2.GetEpisodeResponse(index_rev=rev)
        resp.episode.CopyFrom(self._episode_pb(detail, detail.session))
        resp.before.extend(self._episode_pb(d, None) for d in detail.before)
        resp.after.extend(self._episode_pb(d, None) for d in detail.after)
        return resp

    # -- ingestion ------------------------------------------------------------------------
    def ingest_sync(
        self, paths: Sequence[str] | None, progress: ProgressFn, scope: Scope = None
    ) -> index_service_pb2.OperationSummary:
        with self.storage.guard("ingest"):
            return self._ingest_sync(paths, progress, scope)

    def _scoped_defaults(self, scope: Sequence[str]) -> list[str]:
        """No paths from a scoped operator: the server's log folders (configured, else the
        harnesses' standard ones) that lie, by real path, in its workspaces. None there
        is a clear refusal, not an ingest of folders outside its scope."""
        configured = list(self.session_paths) or default_roots()
        mine = [p for p in configured if really_in_scope(normalise_workspace(p), scope)]
        if not mine:
            raise InvalidRequest(
                "paths: none of the server's session-log folders lies in this principal's "
                "workspaces; name the logs to ingest",
                metadata={"field": "paths"},
            )
        return mine

    def _ingest_sync(
        self, paths: Sequence[str] | None, progress: ProgressFn, scope: Scope
    ) -> index_service_pb2.OperationSummary:
        started = time.perf_counter()
        if not paths and scope is not None:
            paths = self._scoped_defaults(scope)

        def step(done: int, total: int, path: str) -> None:
            if self._cancel.is_set():
                raise Unavailable("the service is stopping; ingest again to go on")
            progress("ingest", done, total, os.path.basename(path))

        with self._write_lock:
            report = ingest(
                self._writer,
                list(paths) if paths else (list(self.session_paths) or None),
                step,
                scope,
            )
            sample = None
            if not paths and not self.session_paths:
                sample = ingest_sample_if_empty(self._writer)
                if sample is not None:
                    report.merge(sample)
        summary = operation_summary(
            report,
            (
                "files_seen",
                "files_changed",
                "files_reimported",
                "events_added",
                "events_duplicate",
                "events_removed",
                "sessions",
            ),
            index_rev=report.index_rev or self._writer.index_rev(),
            changed=bool(report.events_added or report.events_removed or report.files_reimported),
            started=started,
        )
        summary.counters["malformed"] = len(report.malformed)
        summary.counters["unknown"] = len(report.unknown)
        summary.counters["lines_oversized"] = len(report.oversized)
        summary.counters["files_skipped"] = len(report.skipped)
        summary.counters["sessions_out_of_scope"] = report.sessions_out_of_scope
        summary.counters["sessions_conflicting"] = report.sessions_conflicting
        summary.counters["sample_ingested"] = int(sample is not None)
        for loc in report.malformed[:200]:
            summary.problems.add(code="MALFORMED_RECORD", message=loc)
        for loc in report.unknown[:200]:
            summary.problems.add(code="UNKNOWN_RECORD", message=loc)
        for msg in report.oversized[:200]:
            summary.problems.add(code="LINE_TOO_LONG", message=msg)
        for msg in report.skipped[:200]:
            summary.problems.add(code="FILE_SKIPPED", message=msg)
        if report.sessions_out_of_scope:
            summary.problems.add(
                code="SESSION_OUT_OF_SCOPE",
                lane=self.name,
                message=f"{report.sessions_out_of_scope} session(s) left out: their working "
                "directory lies outside the workspaces this principal may manage",
            )
        if report.sessions_conflicting:
            summary.problems.add(
                code="SESSION_CONFLICT",
                lane=self.name,
                message=f"{report.sessions_conflicting} session(s) left out: a log names a "
                "session id that another working directory's session already has",
            )
        for err in report.errors[:50]:
            summary.problems.add(code="FILE_FAILED", message=err)
        if report.errors:
            self.last_error = report.errors[-1]
        return summary

    # -- live ingest ------------------------------------------------------------------------
    def watch_roots(self) -> list[str]:
        """The folders (or files) the start-up ingest reads and the watcher follows: the
        configured session paths, else the harnesses' standard log folders that exist."""
        configured = list(self.session_paths) or default_roots()
        roots = [os.path.abspath(os.path.expanduser(p)) for p in configured]
        return [r for r in dict.fromkeys(roots) if os.path.exists(r)]

    async def follow(
        self, stop: asyncio.Event | None = None, on_change: Callable[[], None] | None = None
    ) -> None:
        """Ingest what the harnesses append to their logs while the server runs, so a
        search finds a turn about a second after it was written. The watcher and its
        ingests run in a child process (``lanes.live``), so they never hold this
        process's interpreter while it answers searches; this task reads the child's
        reports. A child that dies is started again (at most ``FOLLOW_RESTARTS`` times a
        minute), catching up on what changed meanwhile. Returns when ``stop`` is set, the
        watcher fails, or the task is cancelled (the child is stopped then). ``on_change``
        is called (on the loop) after each batch that changed the store."""
        log = get_logger("knowledge.episodes.live")
        roots = self.watch_roots()
        if not roots:
            log.info("live.no_roots")
            return
        starts: list[float] = []
        while True:
            now = time.monotonic()
            starts = [t for t in starts if now - t < 60] + [now]
            if len(starts) > FOLLOW_RESTARTS + 1:
                log.error("live.not_restarted", reason="the watcher exited too often")
                return
            ended = await self._follow_child(
                roots, stop, log, catch_up=len(starts) > 1, on_change=on_change
            )
            if ended != "died" or (stop is not None and stop.is_set()):
                return
            await asyncio.sleep(1.0)

    async def _follow_child(
        self,
        roots: list[str],
        stop: asyncio.Event | None,
        log: structlog.typing.FilteringBoundLogger,
        *,
        catch_up: bool,
        on_change: Callable[[], None] | None = None,
    ) -> str:
        """Run one watcher process until it ends or ``stop`` is set. Returns "stopped"
        (asked to, or the watcher failed and said so) or "died" (exited unannounced)."""
        ctx = mp.get_context("spawn")
        control_r, control_w = ctx.Pipe(duplex=False)
        out_r, out_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=follow_main,
            args=(self.path, str(self.data_dir), roots, catch_up, control_r, out_w),
            name="knowledge-live-ingest",
            daemon=True,
        )
        proc.start()
        control_r.close()
        out_w.close()
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[str] = loop.create_future()

        def readable() -> None:
            try:
                while out_r.poll():
                    if self._on_live_message(out_r.recv(), log, on_change) and not ended.done():
                        ended.set_result("stopped")
            except (EOFError, OSError):
                if not ended.done():
                    ended.set_result("died")

        loop.add_reader(out_r.fileno(), readable)
        waits: list[asyncio.Future[object]] = [ended]  # type: ignore[list-item]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(out_r.fileno())
            for w in waits[1:]:
                w.cancel()
            control_w.close()  # the child sees the pipe close and stops
            await asyncio.shield(asyncio.to_thread(_reap, proc))
            out_r.close()
        if ended.done() and ended.result() == "died":
            self.last_error = f"live ingest: the watcher exited (code {proc.exitcode})"
            log.error("live.exited", exit_code=proc.exitcode)
            return "died"
        return "stopped"

    def _on_live_message(
        self,
        msg: tuple[object, ...],
        log: structlog.typing.FilteringBoundLogger,
        on_change: Callable[[], None] | None = None,
    ) -> bool:
        """Log one report of the watcher process and keep its errors for GetStatus.
        True when the watcher stopped for good."""
        kind = msg[0]
        if kind == "watching":
            log.info("live.watching", roots=msg[1], pid=msg[2])
        elif kind == "batch":
            batch = cast(Batch, msg[1])
            files, added, removed, rev, ms, file_error, failure, full = batch
            self.storage.message = str(full)
            if failure:
                self.last_error = f"live ingest: {failure}"
                log.error("live.ingest_failed", error_type=failure)
            elif file_error:
                self.last_error = str(file_error)
            if files:
                log.info(
                    "live.ingested",
                    files=files,
                    events_added=added,
                    events_removed=removed,
                    index_rev=rev,
                    ms=ms,
                )
                if on_change is not None:
                    on_change()
        elif kind == "stopped":
            self.last_error = f"live ingest stopped: {msg[1]}"
            log.error("live.stopped", error_type=msg[1])
            return True
        return False

    def status(self, workspaces: tuple[str, ...] | None) -> index_service_pb2.LaneStatus:
        with self._readers.get() as store:
            counts = store.counts(workspaces)
            total = store.counts(None)["sessions"]
            rev = store.index_rev()
        st = index_service_pb2.LaneStatus(
            lane=self.name,
            index_rev=rev if total else "",
            capability="full" if total else "degraded",
        )
        st.counts["sessions"] = counts["sessions"]
        st.counts["events"] = counts["indexed_docs"]
        st.counts["live"] = counts.get("live_sessions", 0)
        if not total:
            st.degraded = True
            st.reason = "no session logs have been ingested yet"
        full = self.storage.notice()
        if full is not None:
            st.last_error.CopyFrom(full)
        elif self.last_error:
            st.last_error.CopyFrom(
                errors_pb2.Notice(code="FILE_FAILED", lane=self.name, message=self.last_error)
            )
        return st


def _reap(proc: BaseProcess) -> None:
    """Wait for a watcher process that was told to stop; kill one that does not."""
    proc.join(FOLLOW_STOP_S)
    if proc.is_alive():
        proc.kill()
        proc.join(5.0)
