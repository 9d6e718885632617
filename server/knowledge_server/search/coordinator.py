"""The search coordinator: one question, separate lanes of evidence.

Lanes run concurrently, each under its own timeout; a lane that times out or fails
is degraded with a reason code while the others still answer. Items are ranked
within their lane by RRF with the routing weights (never across lanes: a session's
BM25 and a chunk's hybrid score are not comparable), deduplicated by id within the
lane, diversified, limited, and finally fitted into the token budget.

Token counting (docs/search.md): the response text is its JSON form with proto
field names; tokens = ceil(UTF-8 bytes / 4). Over budget, snippets go first, then
whole items from the end of the global order; errors are never dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf import timestamp_pb2

from knowledge_server._gen.knowledge.v1 import errors_pb2, search_pb2
from knowledge_server.errors import KnowledgeError
from knowledge_server.search.jsonlen import json_size, json_size_of_string
from knowledge_server.search.lanes import (
    BUDGET,
    LANE_DEADLINE,
    UNAVAILABLE,
    Lane,
    LaneMessage,
    LaneQuery,
    LaneResult,
    LaneUnavailable,
    degraded,
    failed,
    lane_answered,
    not_requested,
    why_empty,
)
from knowledge_server.search.routing import route
from knowledge_server.search.validate import SCHEMA, ValidSearch

RRF_K = 60
# Items each lane is asked for before fusion: the seed's top K of 30 (seed 000 §7.1, "by
# default 30"), which at the default limit of 10 is three times the limit; for limits over
# 15, twice the limit, so the diversity caps (3 episodes per actor, 5 code hits per path)
# still leave `limit` items in most answers (the seed allows limits up to 50, §3).
SEED_TOP_K = 30


def lane_top_k(limit: int) -> int:
    return max(SEED_TOP_K, 2 * limit)


LANE_PRIORITY = {"episodes": 0, "code": 1, "skills": 2}
MAX_EPISODES_PER_ACTOR = 3
MAX_CODE_PER_PATH = 5
# The name under which a whole answer's cache key holds the derived layer's revision.
ACTORS = "actors"


def count_tokens(text: str) -> int:
    """Tokens as counted for budgets: ceil(UTF-8 bytes / 4)."""
    return math.ceil(len(text.encode("utf-8")) / 4)


@dataclass
class ActorHints:
    """What the derived layer (L3) knows, used to aggregate actors. Optional."""

    # episode id -> actor id (for diversity and aggregation)
    episode_actor: dict[str, str] = field(default_factory=dict)


# (response, request, the caller's workspaces or None for all) -> the actors behind it.
ActorBuilder = Callable[
    [search_pb2.SearchResponse, ValidSearch, tuple[str, ...] | None], Sequence[search_pb2.Actor]
]


class SearchObserver(Protocol):
    """Told about each lane call and each answer (metrics, traces): ids, counts and
    timings only; an observer never sees the query."""

    # Told about the lanes of a search run inside another call (a dispatch's) too: a
    # trace's lane spans belong under that call, while the metrics count only what
    # Search callers got.
    inner_lanes: bool

    def lane(self, name: str, start_ns: int, end_ns: int, ms: float, result: LaneResult) -> None:
        """A lane answered (or was degraded), between the two wall-clock instants."""

    def answer(self, resp: search_pb2.SearchResponse, *, cache_hit: bool) -> None:
        """The answer as returned (budget applied); ``cache_hit``: served whole from the cache."""


class Coordinator:
    def __init__(
        self,
        lanes: Mapping[str, Lane],
        *,
        timeout_ms: int = 250,
        actor_builder: ActorBuilder | None = None,
        episode_actors: Callable[[Sequence[str]], dict[str, str]] | None = None,
        actors_revision: Callable[[], object] | None = None,
        cache_size: int = 512,
    ) -> None:
        self.lanes = dict(lanes)
        self.timeout_ms = timeout_ms
        self.actor_builder = actor_builder
        # episode ids -> actor ids (for the per-actor diversity cap); default: the session.
        self.episode_actors = episode_actors
        # The revision of what those two read (the derived layer): part of a whole
        # answer's key, as an "actors" lane, whatever lanes the request includes.
        self.actors_revision = actors_revision
        self.cache_size = cache_size
        # Lane results under (lane, revision, query), whole answers under ("response",
        # request, scope, ((lane, revision), ...)).
        self._cache: OrderedDict[object, LaneResult | _Answer] = OrderedDict()
        # Each lane's revision as last read: when one moves, the entries made under its
        # earlier revisions can never be hit again and are dropped at once (see _moved).
        self._revision_seen: dict[str, object] = {}
        self.observers: list[SearchObserver] = []

    async def _observed_lane(
        self,
        name: str,
        q: LaneQuery,
        known_revision: object,
        observers: Sequence[SearchObserver],
    ) -> tuple[LaneResult, float]:
        if not observers:
            return await self._run_lane(name, q, known_revision)
        start_ns = time.time_ns()
        result, ms = await self._run_lane(name, q, known_revision)
        end_ns = time.time_ns()
        for observer in observers:
            observer.lane(name, start_ns, end_ns, ms, result)
        return result, ms

    async def _run_lane(
        self, name: str, q: LaneQuery, known_revision: object = None
    ) -> tuple[LaneResult, float]:
        lane = self.lanes.get(name)
        started = time.perf_counter()
        if lane is None:
            return degraded(
                name,
                "KNOWLEDGE_INDEX_NOT_READY",
                f"the {name} lane is not configured",
                empty_reason=UNAVAILABLE,
            ), 0.0
        # Results are cached per (lane, lane revision, query); a new revision is a new key,
        # so a cached answer is always the answer the current index would give.
        key = None
        if self.cache_size:
            try:
                # The revision read for the whole-answer key a moment ago, when there was one.
                rev = known_revision if known_revision is not None else lane.revision()
                key = (name, rev, q) if rev is not None else None
                if known_revision is None and rev is not None:
                    self._moved(name, rev)
            except Exception:  # noqa: BLE001 - no revision, no cache
                key = None
            cached = self._cache.get(key) if key is not None else None
            if isinstance(cached, LaneResult):
                self._cache.move_to_end(key)
                return _copy_result(cached, cache_hit=True), (time.perf_counter() - started) * 1000
        timeout = self.timeout_ms / 1000
        own: list[float] = []
        try:
            result = await asyncio.wait_for(_bounded(lane, q, timeout, own), timeout=timeout)
            if key is not None and (not result.lane.degraded or len(result.lane.items) > 0):
                self._cache[key] = _copy_result(result, cache_hit=False)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            if own[-1] > timeout:
                # A lane that blocks cannot be cut off by wait_for: an answer after its
                # timeout is not used (it stays cached for the next asker).
                raise TimeoutError
        except TimeoutError:
            result = failed(
                name, "KNOWLEDGE_LANE_TIMEOUT", f"no answer within {self.timeout_ms} ms (timeout)"
            )
        except Exception as exc:  # noqa: BLE001 - a failing lane degrades, the others answer
            result = failed(name, *_failure(name, exc))
        # The lane's own time when it ran (a blocking lane waits for the one before it).
        ms = own[-1] * 1000 if own else (time.perf_counter() - started) * 1000
        return result, ms

    def _revisions(self, names: Sequence[str]) -> tuple[object, ...] | None:
        """Every queried lane's revision, or None when one cannot say (then no caching).
        ``ACTORS`` is the derived layer's (``actors_revision``)."""
        revs = []
        for name in names:
            # A lane that defines no revision() cannot say either (as one that raises).
            read = (
                self.actors_revision
                if name == ACTORS
                else getattr(self.lanes.get(name), "revision", None)
            )
            if read is None:
                return None
            try:
                rev = read()
            except Exception:  # noqa: BLE001 - a lane that cannot say is not cached
                return None
            if rev is None:
                return None
            self._moved(name, rev)
            revs.append(rev)
        return tuple(revs)

    def _moved(self, name: str, rev: object) -> None:
        """``rev`` is lane ``name``'s revision now: when it moved, drop the lane results
        and whole answers made under an earlier one. They would be hit again only if the
        lane went back to that revision, and left in the cache they push out entries that
        still count (a live ingest moves the episodes lane about once a second: without
        this, its dead entries would evict the code lane's results, whose revision did
        not move)."""
        seen = self._revision_seen.get(name)
        if seen == rev:
            return
        self._revision_seen[name] = rev
        if seen is None:
            return
        stale = [key for key in self._cache if _made_under(key, name, rev) is False]
        for key in stale:
            del self._cache[key]

    async def search(
        self, v: ValidSearch, workspaces: tuple[str, ...] | None
    ) -> search_pb2.SearchResponse:
        observers = list(self.observers)
        resp, cache_hit = await self._answer(v, workspaces, observers)
        for observer in observers:
            observer.answer(resp, cache_hit=cache_hit)
        return resp

    async def search_within(
        self, v: ValidSearch, workspaces: tuple[str, ...] | None
    ) -> search_pb2.SearchResponse:
        """The same answer as ``search``, for a search run inside another call (a
        dispatch's): no observer is told of it as an answer, and only those that follow
        inner lanes (traces: the lanes are that call's children) of its lanes; to the
        metrics it is no search answer and no lane's search."""
        observers = [o for o in self.observers if o.inner_lanes]
        resp, _ = await self._answer(v, workspaces, observers)
        return resp

    async def _answer(
        self,
        v: ValidSearch,
        workspaces: tuple[str, ...] | None,
        observers: Sequence[SearchObserver],
    ) -> tuple[search_pb2.SearchResponse, bool]:
        """Whole answers are cached per (request, caller scope, every lane's revision, and
        the derived layer's when actors are made from it): the answer is a function of those
        (KC-12), so a hit is exactly what a fresh run returns."""
        started = time.perf_counter()
        names = [n for n in ("episodes", "code", "skills") if n in v.include]
        keyed: list[str] = list(names)
        if self.actors_revision is not None and (self.actor_builder or self.episode_actors):
            # The actors and the episodes' grouping are read from the derived layer, which
            # a rebuild moves after the episodes' own revision moved: without it in the
            # key, an answer cached in between kept its old actors until the next ingest.
            keyed = [*names, ACTORS]
        revs = self._revisions(keyed) if self.cache_size else None
        key = None
        if revs is not None:
            key = (
                "response",
                dataclasses.replace(v, request_id="", trace=False),
                workspaces,
                tuple(zip(keyed, revs, strict=True)),
            )
            cached = self._cache.get(key)
            if isinstance(cached, _Answer):
                self._cache.move_to_end(key)
                return self._answer_again(cached, v, names, started), True
        resp = await self._search(
            v,
            workspaces,
            started,
            (dict(zip(keyed, revs, strict=True)) if revs is not None else {}),
            observers,
        )
        if key is not None and resp.found and not resp.errors:
            # A lane that timed out or failed this once is not replayed to the next asker
            # (the lanes' own cache keeps the answers that came). Stored before the budget
            # is applied: a hit differs in request id, times and
            # trace, and is fitted afresh unless those take exactly the room they took
            # here (see _answer_again); so the fitted form is kept too.
            stored = search_pb2.SearchResponse()
            stored.CopyFrom(resp)
            stored.ClearField("trace")
            stored.request_id = ""
            _fit_budget(resp, v.max_tokens)
            fitted = None
            if not v.trace:
                fitted = search_pb2.SearchResponse()
                fitted.CopyFrom(resp)
            sizes = _per_call_sizes(resp.request_id, resp.lanes.episodes.observed_at)
            self._cache[key] = _Answer(stored, fitted, sizes)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return resp, False
        _fit_budget(resp, v.max_tokens)
        return resp, False

    def _answer_again(
        self, cached: _Answer, v: ValidSearch, names: Sequence[str], started: float
    ) -> search_pb2.SearchResponse:
        """A cached answer for a new call: its own request id and observation time.

        Fitting the budget depends on the sizes of the text's parts alone. When this
        call's request id and observation time have the sizes the first call's had, and
        neither asks for a trace, fitting the stored answer would remove exactly what it
        removed then: the fitted copy is used as it is (fitting it again was a large share
        of a hit's CPU; figures in bench/RESULTS.md). Otherwise the stored answer is fitted
        afresh."""
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        reuse = (
            cached.fitted is not None
            and not v.trace
            and _per_call_sizes(v.request_id, now) == cached.sizes
        )
        resp = search_pb2.SearchResponse()
        resp.CopyFrom(cached.fitted if reuse else cached.answer)  # type: ignore[arg-type]
        resp.request_id = v.request_id
        resp.lanes.episodes.observed_at.CopyFrom(now)
        if reuse:
            return resp
        if v.trace:
            elapsed = round((time.perf_counter() - started) * 1000, 2)
            for name in names:
                resp.trace.lanes.append(
                    search_pb2.LaneTrace(
                        lane=name,
                        ms=0.0,
                        items=len(_lane_of(resp, name).items),
                        degraded=_lane_of(resp, name).degraded,
                        cache_hit=True,
                    )
                )
            resp.trace.total_ms = elapsed
        _fit_budget(resp, v.max_tokens)
        return resp

    async def _search(  # noqa: C901 - routes, runs the lanes and assembles the answer sections in their published order
        self,
        v: ValidSearch,
        workspaces: tuple[str, ...] | None,
        started: float,
        revisions: dict[str, object],
        observers: Sequence[SearchObserver],
    ) -> search_pb2.SearchResponse:
        r = route(v.query, v.mode, v.include)
        q = LaneQuery(
            query=v.query,
            workspaces=workspaces,
            top_k=lane_top_k(v.limit),
            snippet_chars=v.snippet_chars,
            with_text=v.provenance == "strict",
            session_ids=v.session_ids,
            actor_ids=v.actor_ids,
            skills=v.skills,
            paths=v.paths,
            since=v.since,
            until=v.until,
            outcome=v.outcome,
            docs_only=v.mode in ("docs", "themes"),
            docs_mode=v.mode if v.mode in ("docs", "themes") else "",
            intent=r.intent,
            intent_stated=v.mode != "auto",
        )
        # episodes and code are always present (invariant 1); skills only when asked.
        lane_names = [
            n for n in ("episodes", "code", "skills") if n in v.include or n in ("episodes", "code")
        ]
        queried = [n for n in lane_names if n in v.include]
        results = await asyncio.gather(
            *(self._observed_lane(n, q, revisions.get(n), observers) for n in queried)
        )
        by_name = dict(zip(queried, results, strict=True))

        resp = search_pb2.SearchResponse(schema=SCHEMA, request_id=v.request_id, query=v.query)
        resp.routing.intent = r.intent
        resp.routing.lanes.extend(r.lanes)
        resp.routing.confidence = r.confidence
        resp.routing.confidence_level = r.level
        resp.routing.reason = r.reason
        for lane, w in r.weights.items():
            resp.routing.weights[lane] = w
        resp.fusion.strategy = "rrf"
        resp.fusion.k = RRF_K
        resp.fusion.dedup = "by id"
        for lane, w in r.weights.items():
            resp.fusion.weights[lane] = w

        trace = search_pb2.Trace()
        answered: set[str] = set()
        for name in lane_names:
            if name in by_name:
                result, ms = by_name[name]
            else:
                result, ms = not_requested(name), 0.0
            lane_msg = result.lane
            weight = r.weights.get(name, 0.0)
            n_before = len(lane_msg.items)
            groups: dict[str, str] = {}
            if isinstance(lane_msg, search_pb2.EpisodesLane) and lane_msg.items:
                ids = [it.id for it in lane_msg.items]
                if self.episode_actors is not None:
                    # Inline, like the lanes' revision() calls: remembered per derived
                    # revision, indexed lookups only on a miss; a thread hop costs more.
                    groups = self.episode_actors(ids)
                groups = {it.id: groups.get(it.id) or it.session_id for it in lane_msg.items}
            self._fuse_lane(name, lane_msg, weight, v.limit, groups)
            if result.finish is not None and lane_msg.items:
                try:
                    result.finish(lane_msg.items)
                except Exception:  # noqa: BLE001 - the ranked items still stand
                    resp.warnings.append(
                        errors_pb2.Notice(
                            code="KNOWLEDGE_LANE_DEGRADED",
                            lane=name,
                            message=f"the {name} lane could not add snippets and explanations",
                        )
                    )
            # An empty lane always says why (seed 000 §9): the lane itself when it knows
            # (index empty, nothing indexed in scope), else from how it answered.
            lane_msg.empty_reason = "" if lane_msg.items else why_empty(lane_msg)
            if isinstance(lane_msg, search_pb2.EpisodesLane):
                resp.lanes.episodes.CopyFrom(lane_msg)
                resp.lanes.episodes.observed_at.GetCurrentTime()
            elif isinstance(lane_msg, search_pb2.CodeLane):
                resp.lanes.code.CopyFrom(lane_msg)
            else:
                resp.lanes.skills.CopyFrom(lane_msg)
            resp.warnings.extend(result.warnings)
            resp.errors.extend(result.errors)
            if name in by_name and lane_answered(lane_msg):
                answered.add(name)
            if (
                name in by_name
                and lane_msg.degraded
                and not any(w.code == "KNOWLEDGE_LANE_DEGRADED" for w in result.warnings)
            ):
                resp.warnings.append(
                    errors_pb2.Notice(
                        code="KNOWLEDGE_LANE_DEGRADED",
                        lane=name,
                        message=f"the {name} lane is degraded",
                    )
                )
            if name in by_name:
                trace.lanes.append(
                    search_pb2.LaneTrace(
                        lane=name,
                        ms=round(ms, 2),
                        items=n_before,
                        degraded=lane_msg.degraded,
                        cache_hit=result.cache_hit,
                    )
                )

        # found=false when the sources are down (seed 000 §4.1.8): the primary lanes (episodes,
        # code) when any was asked for, else whatever was asked for. Skills derive from L1,
        # so they cannot stand in for both primary sources.
        core: list[str] = [n for n in ("episodes", "code") if n in by_name] or list(by_name)
        resp.found = any(n in answered for n in core)
        if not resp.found:
            # No source answered: no items, an explicit code (invariant 8).
            for n in ("episodes", "code", "skills"):
                withheld = _lane_of(resp, n)
                if withheld.items:
                    del withheld.items[:]
                    withheld.empty_reason = UNAVAILABLE
            resp.errors.append(
                errors_pb2.Notice(code="KNOWLEDGE_NO_SOURCE", message="no lane could answer")
            )

        if self.actor_builder is not None and resp.found:
            resp.actors.extend(self.actor_builder(resp, v, workspaces))  # inline, as above

        resp.limits.requested = v.limit
        resp.limits.budget.max_tokens = v.max_tokens
        if v.trace:
            trace.total_ms = round((time.perf_counter() - started) * 1000, 2)
            resp.trace.CopyFrom(trace)
        resp.limits.returned = _count_items(resp)
        return resp  # the budget is applied by search()

    def _fuse_lane(
        self,
        name: str,
        lane_msg: search_pb2.EpisodesLane | search_pb2.CodeLane | search_pb2.SkillsLane,
        weight: float,
        limit: int,
        groups: dict[str, str],
    ) -> None:
        """RRF within one lane, dedup by id, diversity, stable order, limit."""
        seen: set[str] = set()
        kept: list[Item] = []
        per_key: dict[str, int] = defaultdict(int)
        rank = 0
        for item in list(_items(lane_msg)):
            key_id = _item_id(item)
            if key_id in seen:
                continue
            seen.add(key_id)
            rank += 1
            item.score = (
                round(weight / (RRF_K + rank), 6) if weight else round(1.0 / (RRF_K + rank), 6)
            )
            if isinstance(item, search_pb2.CodeItem):
                group = f"{item.workspace}\x00{item.path}"
                if per_key[group] >= MAX_CODE_PER_PATH:
                    continue
                per_key[group] += 1
            elif isinstance(item, search_pb2.EpisodeItem):
                group = groups.get(item.id, item.session_id)
                if per_key[group] >= MAX_EPISODES_PER_ACTOR:
                    continue
                per_key[group] += 1
            kept.append(item)
        kept.sort(key=lambda it: _order_key(name, it))
        _replace_items(lane_msg, kept[:limit])


def _failure(name: str, exc: Exception) -> tuple[str, str]:
    """The reason code and message of a lane that raised ``exc``. A ``LaneUnavailable`` or
    ``KnowledgeError`` carries its code and a message written for callers; any other
    exception is named by its type only (its text may hold data)."""
    if isinstance(exc, LaneUnavailable | KnowledgeError):
        detail = " ".join(str(exc).split())[:200]
        if detail and detail != exc.reason:
            return exc.reason, f"the {name} source failed: {detail}"
        return exc.reason, f"the {name} source failed"
    return "KNOWLEDGE_SOURCE_UNAVAILABLE", f"the {name} source failed ({type(exc).__name__})"


# The deadline is also set in LANE_DEADLINE for lanes that block the loop, which a caller's
# asyncio.timeout() cannot interrupt; hence a parameter.
async def _bounded(lane: Lane, q: LaneQuery, timeout: float, own: list[float]) -> LaneResult:  # noqa: ASYNC109 - see above
    """``lane.search(q)`` with its deadline (``LANE_DEADLINE``) counted from when it starts.

    The one timeout rule, whatever the lane's call model (``docs/architecture.md``): a
    lane call has ``timeout`` seconds from its own start. A lane that awaits (an external
    backend) is cancelled there by ``wait_for``; a lane that blocks the loop (ours: SQLite
    reads that stop themselves at ``LANE_DEADLINE``) cannot be cancelled, so an answer it
    returns after its deadline is discarded by the caller. ``own`` receives the lane's own
    duration in seconds, also when it fails."""
    started = time.monotonic()
    token = LANE_DEADLINE.set(started + timeout)
    try:
        return await lane.search(q)
    finally:
        LANE_DEADLINE.reset(token)
        own.append(time.monotonic() - started)


def _copy_result(result: LaneResult, *, cache_hit: bool) -> LaneResult:
    lane = type(result.lane)()
    lane.CopyFrom(result.lane)  # type: ignore[arg-type]  # a new message of the same type
    return LaneResult(
        lane=lane,
        warnings=list(result.warnings),
        errors=list(result.errors),
        cache_hit=cache_hit,
        extras=dict(result.extras),
        finish=result.finish,
    )


@dataclass(frozen=True)
class _Answer:
    """A whole answer in the cache: as the lanes gave it (``answer``), and as fitted to
    the budget for the call that computed it (``fitted``; None when that call asked for
    a trace), with the sizes of the parts a new call changes (``_per_call_sizes``)."""

    answer: search_pb2.SearchResponse
    fitted: search_pb2.SearchResponse | None
    sizes: tuple[int, int]


def _per_call_sizes(request_id: str, observed_at: timestamp_pb2.Timestamp) -> tuple[int, int]:
    """JSON bytes of a request id (0 when empty: not in the text) and of the episodes
    lane's observation time: the parts of a cached answer that differ from call to call."""
    return (json_size_of_string(request_id) if request_id else 0), json_size(observed_at)


Item = search_pb2.EpisodeItem | search_pb2.CodeItem | search_pb2.SkillItem


def _items(lane: LaneMessage) -> Sequence[Item]:
    return lane.items


def _replace_items(lane: LaneMessage, items: Sequence[Item]) -> None:
    """The lane's items become copies of ``items``, in that order."""
    copies = [type(it)() for it in items]
    for dst, src in zip(copies, items, strict=True):
        dst.CopyFrom(src)  # type: ignore[arg-type]  # dst is a new message of src's type
    del lane.items[:]
    lane.items.extend(copies)  # type: ignore[arg-type]  # items come from this lane


def _lane_of(resp: search_pb2.SearchResponse, name: str) -> LaneMessage:
    lanes = resp.lanes
    return lanes.episodes if name == "episodes" else lanes.code if name == "code" else lanes.skills


def _time_key(item: Item) -> float:
    if isinstance(item, search_pb2.EpisodeItem) and item.HasField("time"):
        return -(item.time.seconds + item.time.nanos / 1e9)
    return 0.0


def _item_id(item: Item) -> str:
    return item.name if isinstance(item, search_pb2.SkillItem) else item.id


def _order_key(name: str, item: Item) -> tuple[float, int, float, str]:
    """(score desc, lane_priority, time desc, id asc) - seed 000 §4.1.10."""
    return (-float(item.score), LANE_PRIORITY[name], _time_key(item), _item_id(item))


def _has_items(resp: search_pb2.SearchResponse) -> bool:
    return any(len(_lane_of(resp, n).items) for n in ("episodes", "code", "skills"))


def _count_items(resp: search_pb2.SearchResponse) -> int:
    return sum(len(_lane_of(resp, n).items) for n in ("episodes", "code", "skills"))


def _global_order(resp: search_pb2.SearchResponse) -> list[tuple[str, Item]]:
    entries: list[tuple[str, Item]] = []
    for name in ("episodes", "code", "skills"):
        for item in _items(_lane_of(resp, name)):
            entries.append((name, item))
    entries.sort(key=lambda e: _order_key(e[0], e[1]))
    return entries


def _tokens_for(size: int, resp: search_pb2.SearchResponse) -> int:
    """Tokens of a response whose text is ``size`` bytes without ``used_tokens``, once
    ``used_tokens`` (whose own digits are part of the text) is set to that count:
    tokens = ceil((size + len(',"used_tokens":') + digits(tokens)) / 4), solved exactly."""
    extra = len(',"used_tokens":') if resp.limits.budget.max_tokens else len('"used_tokens":')
    used = math.ceil((size + extra + 1) / 4)
    for _ in range(4):
        nxt = math.ceil((size + extra + len(str(used))) / 4)
        if nxt == used:
            break
        used = nxt
    return used


def _measure(resp: search_pb2.SearchResponse) -> tuple[int, int]:
    """(tokens, bytes without used_tokens) of the response text; sets ``used_tokens``."""
    resp.limits.budget.used_tokens = 0
    size = json_size(resp)
    return _settle(resp, size), size


def _settle(resp: search_pb2.SearchResponse, size: int) -> int:
    """Set ``used_tokens`` for a text of ``size`` bytes (without the count itself)."""
    used = _tokens_for(size, resp)
    resp.limits.budget.used_tokens = used
    return used


def _fit_budget(resp: search_pb2.SearchResponse, max_tokens: int) -> None:  # noqa: C901 - the trimming order (snippets, then items, per lane) with exact size bookkeeping; held by a property test
    """Enforce max_tokens on the response text: snippets first (lowest-ranked first), then
    whole items from the end of the global order; errors are never removed.

    The text is measured once; each change then adjusts the size by exactly what it
    added or took out, re-measuring only the small parts it touched (a property test,
    tests/test_budget_fit.py, holds the result to the real serialised size)."""
    used, size = _measure(resp)
    if used <= max_tokens:
        return
    notice = errors_pb2.Notice(
        code="KNOWLEDGE_BUDGET_EXCEEDED", message=f"response trimmed to fit {max_tokens} tokens"
    )
    size += json_size(notice) + (1 if resp.warnings else len('"warnings":[],'))
    resp.warnings.append(notice)
    before = json_size(resp.limits)
    resp.limits.truncated = True
    size += json_size(resp.limits) - before
    # Phase 1: snippets. One summary entry per lane; the items stay, visibly without snippet.
    snippet_counts: dict[str, int] = defaultdict(int)
    entries: dict[str, search_pb2.Dropped] = {}
    for name, item in reversed(_global_order(resp)):
        if _tokens_for(size, resp) <= max_tokens:
            break
        if isinstance(item, search_pb2.SkillItem) or not item.snippet:
            continue
        # '"snippet":' plus the comma that separated it from the item's other fields.
        size -= len('"snippet":,') + json_size_of_string(item.snippet)
        item.snippet = ""
        snippet_counts[name] += 1
        n = snippet_counts[name]
        if n > 1:  # the lane's entry counts one more: only its digits change
            entries[name].count = n
            size += len(str(n)) - len(str(n - 1))
        else:
            before = json_size(resp.limits)
            _set_snippet_entries(resp, snippet_counts)
            size += json_size(resp.limits) - before
            entries = {d.lane: d for d in resp.limits.dropped if d.what == "snippet"}
    if _settle(resp, size) <= max_tokens:
        return
    # Phase 2: whole items from the end; evidence pointing at them goes too. The first
    # removals are named one by one (lane, id); past MAX_NAMED_DROPS they are counted per
    # lane instead, or naming them would eat the budget the items need (a limit of 50 once
    # left 0 items and 114 names).
    cites: dict[tuple[str, str], set[str]] = defaultdict(set)
    for a in resp.actors:
        for e in a.evidence:
            cites[(e.lane, e.id)].add(a.actor_id)
    summarised = False
    for name, item in reversed(_global_order(resp)):
        item_id = _item_id(item)
        item_bytes = json_size(item)
        limits = resp.limits
        returned_before = limits.returned
        # Named entries are few: limits is re-measured. Counted ones change by digits.
        limits_before = None if summarised else json_size(limits)
        # Only the actors citing the item change, and those left without evidence go
        # (with the first such removal, also any actor that had no evidence at all).
        citing_ids = cites.get((name, item_id), set())
        n_actors = len(resp.actors)
        citing = (
            {i for i, a in enumerate(resp.actors) if a.actor_id in citing_ids}
            if citing_ids
            else set()
        )
        # Actors that leave (their evidence is only this item, or none at all) count
        # whole; the others lose the matching evidence entries and their commas.
        leaving: set[int] = set()
        leaving_bytes = evidence_bytes = 0
        if citing:
            leaving = {
                i
                for i, a in enumerate(resp.actors)
                if (i in citing or not len(a.evidence))
                and all(e.lane == name and e.id == item_id for e in a.evidence)
            }
            leaving_bytes = sum(json_size(resp.actors[i]) for i in leaving)
            for i in citing - leaving:
                for e in resp.actors[i].evidence:
                    if e.lane == name and e.id == item_id:
                        evidence_bytes += json_size(e) + 1
        lane = _lane_of(resp, name)
        # A lane's items are in the global order too: the item is usually its last one.
        for i in range(len(lane.items) - 1, -1, -1):
            if _item_id(lane.items[i]) == item_id:
                del lane.items[i]
                break
        # The item and a comma, or the whole '"items":[...]' member once it is empty (with
        # the comma that parted it from the lane's other fields, if it has any).
        if lane.items:
            size -= item_bytes + 1
        else:
            size -= item_bytes + len('"items":[]') + (1 if lane.ListFields() else 0)
            # The lane is empty now, and says so (seed 000 §9): the budget took its items.
            before = json_size(lane)
            lane.empty_reason = BUDGET
            size += json_size(lane) - before
        gone = [(name, item_id)]
        if citing:
            gone += [("actors", a) for a in _prune_evidence(resp, name, item_id, citing_ids)]
            if not resp.actors:  # the whole '"actors":[...],' member is gone
                size -= leaving_bytes + n_actors - 1 + len('"actors":[],')
            else:
                size -= evidence_bytes + leaving_bytes + len(leaving)
        limits.returned = _count_items(resp)
        if limits_before is None and limits.returned:
            size += _count_drops(limits, gone)
            size += len(str(limits.returned)) - len(str(returned_before))
        else:
            if limits_before is None:  # '"returned":N' leaves with the last item
                limits.returned = returned_before
                limits_before = json_size(limits)
                limits.returned = 0
            summarised = _record_drops(limits, gone, summarised)
            size += json_size(limits) - limits_before
        if _settle(resp, size) <= max_tokens:
            return
    # Nothing left to remove but the list of removals: summarise it per lane.
    if _measure(resp)[0] > max_tokens:
        _summarise_item_entries(resp.limits)
    _measure(resp)


def _set_snippet_entries(resp: search_pb2.SearchResponse, counts: dict[str, int]) -> None:
    kept = [d for d in resp.limits.dropped if d.what != "snippet"]
    entries = [
        search_pb2.Dropped(lane=lane, what="snippet", count=n) for lane, n in counts.items() if n
    ]
    del resp.limits.dropped[:]
    resp.limits.dropped.extend(entries + [_copy(d) for d in kept])


def _summarise_item_entries(limits: search_pb2.Limits) -> None:
    """One entry per (lane, what), counting the removals it stands for."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for d in limits.dropped:
        counts[(d.lane, d.what)] += max(d.count, 1)
    del limits.dropped[:]
    for (lane, what), n in counts.items():
        limits.dropped.append(search_pb2.Dropped(lane=lane, what=what, count=n))


# Removed items (and actors) named one by one in limits.dropped; beyond this, counted per lane.
MAX_NAMED_DROPS = 10


def _record_drops(limits: search_pb2.Limits, gone: list[tuple[str, str]], summarised: bool) -> bool:
    """Enter removed items as (lane, id) while there are few named ones, then as counts per
    lane. Returns whether the entries are counts now."""
    if not summarised:
        named = sum(1 for d in limits.dropped if d.what == "item")
        if named + len(gone) <= MAX_NAMED_DROPS:
            for lane, item_id in gone:
                limits.dropped.append(
                    search_pb2.Dropped(lane=lane, id=item_id, what="item", count=1)
                )
            return False
        _summarise_item_entries(limits)
    _count_drops(limits, gone)
    return True


def _count_drops(limits: search_pb2.Limits, gone: list[tuple[str, str]]) -> int:
    """Add removals to the per-lane counts; returns how many bytes the text grew by (the
    counts' digits, or a new lane's entry and its comma)."""
    counts = {d.lane: d for d in limits.dropped if d.what == "item"}
    grown = 0
    for lane, _ in gone:
        entry = counts.get(lane)
        if entry is None:
            entry = counts[lane] = limits.dropped.add(lane=lane, what="item", count=1)
            grown += json_size(entry) + (1 if len(limits.dropped) > 1 else len('"dropped":[],'))
        else:
            grown += len(str(entry.count + 1)) - len(str(entry.count))
            entry.count += 1
    return grown


def _copy(d: search_pb2.Dropped) -> search_pb2.Dropped:
    out = search_pb2.Dropped()
    out.CopyFrom(d)
    return out


def _prune_evidence(
    resp: search_pb2.SearchResponse, lane: str, item_id: str, citing: set[str]
) -> list[str]:
    """Remove the evidence pointing at a dropped item (cited by the actors in ``citing``),
    and the actors left without any; returns the removed actors' ids, in order."""
    gone = []
    for i, actor in enumerate(resp.actors):
        if actor.actor_id in citing:
            for j in range(len(actor.evidence) - 1, -1, -1):
                e = actor.evidence[j]
                if e.lane == lane and e.id == item_id:
                    del actor.evidence[j]
        if not len(actor.evidence):
            gone.append(i)
    removed = [resp.actors[i].actor_id for i in gone]
    for i in reversed(gone):
        del resp.actors[i]
    return removed


def _made_under(key: object, name: str, rev: object) -> bool | None:
    """Whether cache entry ``key`` was made under lane ``name``'s revision ``rev`` (None:
    the entry does not depend on that lane)."""
    if not isinstance(key, tuple):
        return None
    if key[0] == name:
        return bool(key[1] == rev)
    if key[0] == "response":
        for lane, r in key[3]:
            if lane == name:
                return bool(r == rev)
    return None
