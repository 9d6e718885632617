"""The skills lane and actor aggregation (L3) behind the coordinator, plus RebuildDerived.

Actors are aggregated from the episodes and skills items of one response: every
actor's evidence points at ids present in that response (KC-7). Score per seed 000
§7.5: max + 0.3 * mean(top 3) of its evidence scores.

``dispatch.available`` is the truth about this machine (KD-4): a hand-off can only be
received where the actor's harness is installed (its CLI is on PATH) and the outbox
is writable; the reason names what was checked.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from knowledge_server._gen.knowledge.v1 import errors_pb2, index_service_pb2, search_pb2
from knowledge_server.derived.build import rebuild
from knowledge_server.derived.lane import InvalidQuery, search_skills
from knowledge_server.derived.skills import default_roots, load_catalog
from knowledge_server.derived.store import (
    Assignment,
    DerivedStore,
    actor_in_scope,
    workspace_clause,
)
from knowledge_server.episodes.store import EpisodeStore
from knowledge_server.lanes.common import (
    Pool,
    ProgressFn,
    StorageErrors,
    WriterLock,
    bound_store,
    operation_summary,
    run_bounded,
)
from knowledge_server.memo import RevisionMemo
from knowledge_server.schema import snapshot
from knowledge_server.search.lanes import (
    INDEX_EMPTY,
    NO_MATCH,
    NOT_INDEXED,
    LaneQuery,
    LaneResult,
    degraded,
)
from knowledge_server.search.validate import ValidSearch
from knowledge_server.workspaces import in_scope

SOURCE = "knowledge.skills+derived"
DB_FILE = "derived.sqlite"

# Harness -> the command that can receive a hand-off on this machine.
HARNESS_COMMANDS = {
    "claude-code": "claude",
    "codex": "codex",
    "opencode": "opencode",
    "aider": "aider",
}
MODE_BY_KIND = {
    "root_session": "spawn_replica",
    "subagent": "spawn_replica",
    "team_member": "team_task",
    "autoclaw_agent": "external_handoff",
}


def dispatch_info(kind: str, harness: str, outbox: Path) -> search_pb2.DispatchInfo:
    """How an actor could receive a task here, and whether it really can (checked now)."""
    mode = MODE_BY_KIND.get(kind, "none")
    if mode == "none":
        return search_pb2.DispatchInfo(mode="none", available=False, reason="recommendation only")
    if mode == "external_handoff":
        ok = _writable(outbox)
        return search_pb2.DispatchInfo(
            mode=mode,
            available=ok,
            reason="package to the outbox" if ok else f"outbox {outbox} is not writable",
        )
    command = HARNESS_COMMANDS.get(harness)
    if command is None:
        return search_pb2.DispatchInfo(
            mode=mode, available=False, reason=f"no known launcher for harness {harness!r} here"
        )
    if shutil.which(command) is None:
        return search_pb2.DispatchInfo(
            mode=mode,
            available=False,
            reason=f"{command!r} is not installed on this machine (not on PATH)",
        )
    if not _writable(outbox):
        return search_pb2.DispatchInfo(
            mode=mode, available=False, reason=f"outbox {outbox} is not writable"
        )
    return search_pb2.DispatchInfo(
        mode=mode,
        available=True,
        reason=f"{command!r} found on PATH; package goes to the outbox for the lead to run",
    )


def _writable(path: Path) -> bool:
    probe = path if path.exists() else path.parent
    return probe.exists() and os.access(probe, os.W_OK)


def _why_empty(store: DerivedStore, scope: Sequence[str] | None) -> str:
    """Why a skills search found nothing: no skill catalogued at all, none whose SKILL.md
    lies in the caller's workspaces, or no match among those."""
    if store.conn.execute("SELECT 1 FROM skill LIMIT 1").fetchone() is None:
        return INDEX_EMPTY
    within = workspace_clause("s.path", scope)
    if within is None:
        return NOT_INDEXED
    visible = store.conn.execute(
        f"SELECT 1 FROM skill s WHERE {within[0]} LIMIT 1",  # noqa: S608 - a condition made of constants and placeholders, values bound
        within[1],
    ).fetchone()
    return NO_MATCH if visible is not None else NOT_INDEXED


class EpisodeSource(Protocol):
    """What the rebuild needs of the episodes lane (``lanes/episodes.py``)."""

    def snapshot(self) -> AbstractContextManager[EpisodeStore]: ...


class DerivedLane:
    """The skills lane (search over the SKILL.md catalog with use counts) and the actor index."""

    name = "skills"

    def __init__(
        self, data_dir: Path, *, skill_roots: Sequence[str] = (), workspaces: Sequence[str] = ()
    ) -> None:
        self.data_dir = data_dir
        self.path = str(data_dir / DB_FILE)
        self.outbox = data_dir / "outbox"
        self.roots = list(skill_roots) or [str(p) for p in default_roots(workspaces)]
        self._writer = DerivedStore(self.path)
        self._write_lock = WriterLock(data_dir, "derived")
        # Remembered per derived revision: the actor of each episode id, and each actor's
        # facts (``store.actor``, ``store.skills_of_actor``).
        self._actor_of: RevisionMemo[str, str | None] = RevisionMemo(100_000)
        self._facts: RevisionMemo[str, tuple[Any, list[tuple[str, int]], frozenset[str | None]]] = (
            RevisionMemo(100_000)
        )
        self._readers: Pool[DerivedStore] = Pool(
            lambda: bound_store(DerivedStore(self.path, read_only=True))
        )
        self.last_error = ""
        self.storage = StorageErrors(self.name)

    def close(self) -> None:
        self._readers.close_all(lambda s: s.close())
        self._writer.close()

    # -- skills lane ---------------------------------------------------------------------
    def _search_sync(self, q: LaneQuery) -> LaneResult:
        with self._readers.get() as store, snapshot(store.conn):
            rev = store.index_rev()  # "" until the first build
            if not rev:
                return degraded(
                    self.name,
                    "KNOWLEDGE_INDEX_NOT_READY",
                    "the derived layer (skills, actors) has not been built yet",
                )
            lane = search_pb2.SkillsLane(source=SOURCE, index_rev=rev)
            if q.workspaces == ():
                lane.empty_reason = NOT_INDEXED
                return LaneResult(lane=lane)
            try:
                hits = search_skills(
                    store,
                    q.query,
                    limit=q.top_k,
                    skills=list(q.skills) or None,
                    actor_ids=list(q.actor_ids) or None,
                    workspaces=q.workspaces,
                    scope=q.workspaces,
                )
            except InvalidQuery:
                lane.empty_reason = NO_MATCH
                return LaneResult(
                    lane=lane,
                    warnings=[
                        errors_pb2.Notice(
                            code="KNOWLEDGE_INVALID_REQUEST",
                            lane=self.name,
                            message="the query has no searchable words for this lane",
                        )
                    ],
                )
            if not hits:
                lane.empty_reason = _why_empty(store, q.workspaces)
        for h in hits:
            item = lane.items.add(
                name=h.name,
                path=h.path,
                description=h.description,
                when_to_use=h.when_to_use or "",
                content_hash=h.content_hash,
                uses=h.uses,
                score=h.score,
                why=list(h.why),
            )
            for actor_id, episode_id in h.used_by:
                item.used_by.add(actor_id=actor_id, episode_id=episode_id)
        return LaneResult(lane=lane)

    def revision(self) -> str:
        with self._readers.get() as store:
            return store.index_rev()  # "" until the first build

    async def search(self, q: LaneQuery) -> LaneResult:
        return run_bounded(self._search_sync, q)

    # -- actors ---------------------------------------------------------------------------
    def dispatch_info(self, kind: str, harness: str) -> search_pb2.DispatchInfo:
        return dispatch_info(kind, harness, self.outbox)

    def episode_actors(self, episode_ids: Sequence[str]) -> dict[str, str]:
        with self._readers.get() as store:
            rev = store.index_rev()
            return self._episode_actors(store, rev, episode_ids) if rev else {}

    def _episode_actors(
        self, store: DerivedStore, rev: str, episode_ids: Sequence[str]
    ) -> dict[str, str]:
        """``store.episode_actors`` at derived revision ``rev``, remembered: a search asks
        twice (diversity, then actors) and popular sessions recur across searches."""
        known = self._actor_of.at(rev)
        missing = [e for e in episode_ids if e not in known]
        if missing:
            found = store.episode_actors(missing)
            for e in missing:
                known[e] = found.get(e)
        return {e: a for e in episode_ids if (a := known.get(e)) is not None}

    def _actor_facts(
        self, store: DerivedStore, rev: str, actor_id: str
    ) -> tuple[Any, list[tuple[str, int]], frozenset[str | None]]:
        """(``store.actor``, ``store.skills_of_actor``, ``store.actor_folders``) at derived
        revision ``rev``, remembered: the same actors recur across searches, and each
        costs three lookups."""
        known = self._facts.at(rev)
        facts = known.get(actor_id)
        if facts is None:
            facts = known[actor_id] = (
                store.actor(actor_id),
                store.skills_of_actor(actor_id),
                store.actor_folders(actor_id),
            )
        return facts

    def build_actors(  # noqa: C901 - gathers each actor's evidence from both lanes, then its summary
        self,
        resp: search_pb2.SearchResponse,
        v: ValidSearch,
        scope: tuple[str, ...] | None = None,
    ) -> list[search_pb2.Actor]:
        """Aggregate actors from this response's items (evidence = ids in the response
        only). An actor whose workspace (where all of its sessions ran) is not in ``scope``
        is left out: its skills and outcomes are those of sessions the caller cannot see."""
        ep_items = list(resp.lanes.episodes.items)
        skill_items = list(resp.lanes.skills.items)
        if not ep_items and not skill_items:
            return []
        evidence: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
        with self._readers.get() as store, snapshot(store.conn):
            rev = store.index_rev()  # "" until the first build
            if not rev:
                return []
            mapping = self._episode_actors(store, rev, [it.id for it in ep_items])
            for it in ep_items:
                actor_id = mapping.get(it.id)
                if actor_id:
                    evidence[actor_id].append(("episodes", it.id, it.score))
            for sk in skill_items:
                for use in sk.used_by:
                    evidence[use.actor_id].append(("skills", sk.name, sk.score))
            wanted = set(v.actor_ids)
            actors: list[search_pb2.Actor] = []
            # Checked now, once per (kind, harness) of this response: PATH lookups are stats.
            reach: dict[tuple[str, str], search_pb2.DispatchInfo] = {}
            for actor_id, ev in evidence.items():
                if wanted and actor_id not in wanted:
                    continue
                info, skills, folders = self._actor_facts(store, rev, actor_id)
                if info is None or not actor_in_scope(info, folders, scope):
                    continue
                seen: set[tuple[str, str]] = set()
                unique = []
                for lane, item_id, score in ev:
                    if (lane, item_id) not in seen:
                        seen.add((lane, item_id))
                        unique.append((lane, item_id, score))
                scores = sorted((s for _, _, s in unique), reverse=True)
                top3 = scores[:3]
                score = scores[0] + 0.3 * (sum(top3) / len(top3))
                n_ep = sum(1 for lane, _, _ in unique if lane == "episodes")
                n_sk = sum(1 for lane, _, _ in unique if lane == "skills")
                sessions = info.success + info.failure + info.unknown
                why = []
                if n_ep:
                    why.append(f"{n_ep} matching episode{'s' if n_ep != 1 else ''}")
                for name, uses in skills[:2]:
                    why.append(f"skill {name} ({uses} use{'s' if uses != 1 else ''})")
                if sessions:
                    why.append(
                        f"outcome: {info.success} success / {info.failure} failure of {sessions} sessions"
                    )
                confidence = min(
                    0.95,
                    0.4
                    + 0.1 * min(n_ep, 3)
                    + 0.1 * (n_sk > 0)
                    + (0.15 * info.success / sessions if sessions else 0.0),
                )
                actor = search_pb2.Actor(
                    actor_id=actor_id,
                    name=info.name,
                    kind=info.kind,
                    source=info.source or info.harness,
                    confidence=round(confidence, 2),
                    score=round(score, 6),
                    why=why,
                )
                for lane, item_id, _ in unique:
                    actor.evidence.add(lane=lane, id=item_id)
                for name, uses in skills:
                    actor.skills.add(name=name, uses=uses)
                how = (info.kind, info.harness)
                if how not in reach:
                    reach[how] = dispatch_info(info.kind, info.harness, self.outbox)
                actor.dispatch.CopyFrom(reach[how])
                actors.append(actor)
        actors.sort(key=lambda a: (-a.score, a.actor_id))
        return actors[: v.limit]

    # -- dispatch ----------------------------------------------------------------------------
    @contextmanager
    def built_store(self) -> Iterator[DerivedStore | None]:
        """A pooled reader for a few reads outside a lane call (dispatch planning), or
        None until the first build."""
        with self._readers.get() as store:
            yield store if store.is_built() else None

    def record_assignment(
        self, actor_id: str, task_hash: str, outbox_path: str, task_key: str | None = None
    ) -> tuple[Assignment, bool]:
        """Record a dispatch's ``recorded_plan`` assignment, once per (actor, task), on
        this lane's own writer under its writer lock: the store has one writer, so a commit
        never contends with a rebuild's transaction (it waits for the rebuild instead)."""
        with self.storage.guard("dispatch commit"), self._write_lock:
            return self._writer.record_assignment(actor_id, task_hash, outbox_path, task_key)

    # -- rebuild ---------------------------------------------------------------------------
    def rebuild_sync(
        self,
        source: EpisodeSource,
        full: bool,
        progress: ProgressFn,
        scope: tuple[str, ...] | None = None,
    ) -> index_service_pb2.OperationSummary:
        """Rebuild from the episodes lane's store, read through the lane (its owner).

        The rebuild covers every workspace (the layer is one); what it reports is the
        caller's: with a ``scope``, the counts are those within it and only the catalog
        problems of skill files there are named."""
        with self.storage.guard("rebuild"):
            return self._rebuild_sync(source, full, progress, scope)

    def _rebuild_sync(
        self,
        source: EpisodeSource,
        full: bool,
        progress: ProgressFn,
        scope: tuple[str, ...] | None,
    ) -> index_service_pb2.OperationSummary:
        started = time.perf_counter()
        with self._write_lock, source.snapshot() as episodes:
            catalog = load_catalog(self.roots)
            report = rebuild(
                episodes,
                self._writer,
                self.roots,
                full=full,
                progress_callback=lambda d, t: progress("rebuild", d, t, ""),
                catalog=catalog,
            )
            scoped = None if scope is None else self._writer.counts(scope)
        summary = operation_summary(
            report,
            ("actors", "skills", "skill_uses", "sessions_processed"),
            index_rev=report.index_rev,
            changed=report.changed,
            started=started,
        )
        problems = list(report.problems)
        if scoped is not None:
            # sessions_processed counts work over every workspace: not the caller's to see.
            del summary.counters["sessions_processed"]
            for key in ("actors", "skills", "skill_uses"):
                summary.counters[key] = scoped[key]
            problems = [
                f"{p.path}: {p.reason}" for p in catalog.problems if in_scope(p.path, scope)
            ]
        for problem in problems[:100]:
            summary.problems.add(code="SKILL_CATALOG", message=str(problem))
        return summary

    def status(self, workspaces: tuple[str, ...] | None) -> index_service_pb2.LaneStatus:
        with self._readers.get() as store:
            built = store.is_built()
            st = index_service_pb2.LaneStatus(
                lane=self.name,
                index_rev=store.index_rev() if built else "",
                capability="full" if built else "degraded",
            )
            if built:
                for key, value in store.counts(workspaces).items():
                    st.counts[key] = int(value)
        if not built:
            st.degraded = True
            st.reason = "the derived layer has not been built yet"
        full = self.storage.notice()
        if full is not None:
            st.last_error.CopyFrom(full)
        return st
