"""The lane interface. Our own lanes implement it, and so can an external backend
(a remote session service, another code index): the coordinator only sees this.

A lane returns its own protobuf lane message (EpisodesLane, CodeLane or SkillsLane)
with items ranked best first; the coordinator fuses, limits and budgets them.

A lane may leave the costly parts of its items (snippets, explanations, session details)
for a second step, ``LaneResult.finish``: the coordinator calls it with the items it
kept, after fusion. A lane ranks two to three times as many items as an answer keeps, so our
lanes describe only those. A lane that returns complete items leaves ``finish`` unset.

The coordinator gives each lane a timeout. It sets ``LANE_DEADLINE`` (a
``time.monotonic()`` instant) in the context the lane's ``search`` runs in, so a lane that
blocks instead of awaiting (our own lanes run their SQLite reads on the event loop) can
stop its own work there: an answer that arrives after the deadline is not used anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from knowledge_server._gen.knowledge.v1 import errors_pb2, search_pb2

LaneMessage = search_pb2.EpisodesLane | search_pb2.CodeLane | search_pb2.SkillsLane

# When the current lane call must have answered (time.monotonic()); None outside a search.
LANE_DEADLINE: ContextVar[float | None] = ContextVar("knowledge_lane_deadline", default=None)


class LaneUnavailable(Exception):
    """What a lane raises when its source cannot answer and it can say why with a reason
    code (seed 000 §9, e.g. ``SESSION_QUERY_SEARCH_DISABLED``): the lane is degraded with
    that code, and ``errors[]`` names it with ``message`` (written for callers: never query
    text, snippets or secrets). Any other exception degrades it as
    KNOWLEDGE_SOURCE_UNAVAILABLE, named by its type only."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


@dataclass(frozen=True)
class LaneQuery:
    """What a lane is asked. ``workspaces`` is already the caller's effective scope:
    None = unrestricted, () = nothing visible. Lanes enforce it in their queries."""

    query: str
    workspaces: tuple[str, ...] | None
    top_k: int = 30
    snippet_chars: int = 240
    with_text: bool = True
    session_ids: tuple[str, ...] = ()
    actor_ids: tuple[str, ...] = ()
    skills: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    outcome: str = "any"
    # mode=docs|themes: the code lane answers from document chunks only (Markdown, text).
    docs_only: bool = False
    # "docs" or "themes" when the caller asked for that mode ("" otherwise).
    docs_mode: str = ""
    # The router's intent (find_code, find_agent ...): the code lane weighs file kinds by it.
    intent: str = ""
    # The caller's mode set the intent (mode=find_knowledge ...), rather than the router's
    # cue words (mode=auto).
    intent_stated: bool = False


@dataclass
class LaneResult:
    lane: LaneMessage
    warnings: list[errors_pb2.Notice] = field(default_factory=list)
    errors: list[errors_pb2.Notice] = field(default_factory=list)
    cache_hit: bool = False
    # Lane-specific extras for the coordinator (e.g. episode -> actor ids).
    extras: dict[str, object] = field(default_factory=dict)
    # Completes the kept items in place (see the module docstring). Called once per
    # answer, also for a cached result (with fresh copies of its items), so it must not
    # depend on anything it uses up. An exception leaves the items as they are and the
    # answer says so (KNOWLEDGE_LANE_DEGRADED).
    finish: Callable[[Sequence[Any]], None] | None = None


class Lane(Protocol):
    """What the coordinator needs of a lane, and all it sees of one."""

    name: str

    async def search(self, q: LaneQuery) -> LaneResult: ...

    def revision(self) -> Hashable | None:
        """What the lane's answers are a function of, besides the query (its index
        revision): results are cached under it. None = the lane cannot say, and its
        answers are never cached."""
        ...


# Why a lane has no items (``empty_reason`` of each lane message; docs/search.md,
# "Empty lanes"). The lane that searched sets the first three; the coordinator the others.
NO_MATCH = "no_match"  # data in the caller's scope was searched; nothing matched
INDEX_EMPTY = "index_empty"  # the lane's store holds nothing yet
NOT_INDEXED = "not_indexed"  # the store holds data, none of it in the caller's workspaces
NOT_REQUESTED = "not_requested"  # left out of ``include``
UNAVAILABLE = "unavailable"  # failed, timed out, or no source answered (errors[] says why)
BUDGET = "budget"  # its items were removed to fit the token budget (limits.dropped)
EMPTY_REASONS = (NO_MATCH, INDEX_EMPTY, NOT_INDEXED, NOT_REQUESTED, UNAVAILABLE, BUDGET)


# Degradations whose source did not answer at all.
_UNAVAILABLE = (
    "KNOWLEDGE_SOURCE_UNAVAILABLE",
    "KNOWLEDGE_INDEX_NOT_READY",
    "KNOWLEDGE_LANE_TIMEOUT",
    "SESSION_QUERY_",
)


def lane_answered(lane: LaneMessage) -> bool:
    """The lane's source answered (possibly degraded in capability, e.g. lexical only)."""
    return not lane.degraded or not lane.degradation_reason.startswith(_UNAVAILABLE)


def why_empty(lane: LaneMessage) -> str:
    """Why a lane without items has none: the reason the lane gave, else ``no_match`` when
    its source answered and ``unavailable`` when it did not."""
    if lane.empty_reason:
        return lane.empty_reason
    return NO_MATCH if lane_answered(lane) else UNAVAILABLE


def empty_lane(name: str) -> LaneMessage:
    if name == "episodes":
        return search_pb2.EpisodesLane(
            source="knowledge.episodes", counts=search_pb2.EpisodeCounts()
        )
    if name == "code":
        return search_pb2.CodeLane(
            source="knowledge.code", capability="degraded", freshness=search_pb2.Freshness()
        )
    return search_pb2.SkillsLane(source="knowledge.skills+derived")


def degraded(name: str, code: str, reason: str, empty_reason: str = INDEX_EMPTY) -> LaneResult:
    """An empty, degraded lane whose index is missing or not built: a warning (seed 000
    §9, ``KNOWLEDGE_INDEX_NOT_READY``: the lane is empty, with a warning)."""
    lane = empty_lane(name)
    lane.degraded = True
    lane.degradation_reason = f"{code}: {reason}"
    lane.empty_reason = empty_reason
    notice = errors_pb2.Notice(code=code, lane=name, message=reason)
    return LaneResult(lane=lane, warnings=[notice])


def failed(name: str, code: str, reason: str) -> LaneResult:
    """An empty, degraded lane whose source could not answer (failure, timeout): the
    cause goes to ``errors[]`` (KC-3: "errors names the cause"); the coordinator adds the
    ``KNOWLEDGE_LANE_DEGRADED`` warning of seed 000 §9."""
    lane = empty_lane(name)
    lane.degraded = True
    lane.degradation_reason = f"{code}: {reason}"
    lane.empty_reason = UNAVAILABLE
    notice = errors_pb2.Notice(code=code, lane=name, message=reason)
    return LaneResult(lane=lane, errors=[notice])


def not_requested(name: str) -> LaneResult:
    """A lane the caller left out of ``include``: present (seed 000 §4.1.1), empty, not
    degraded, no notice; ``empty_reason`` says it was not asked."""
    lane = empty_lane(name)
    if isinstance(lane, search_pb2.CodeLane):
        lane.capability = ""
        lane.ClearField("freshness")
    lane.empty_reason = NOT_REQUESTED
    return LaneResult(lane=lane)


class NotReadyLane:
    """A lane whose index does not exist yet: empty, degraded, and says why."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self._reason = reason

    async def search(self, q: LaneQuery) -> LaneResult:
        return degraded(self.name, "KNOWLEDGE_INDEX_NOT_READY", self._reason)

    def revision(self) -> None:
        return None
