"""The search cache when one lane's revision moves (a live ingest moves the episodes
lane's about once a second).

Invariants: the entries made under a lane's earlier revision leave the cache as soon as
the coordinator reads a new one, so they never push out the entries of the lanes whose
revision did not move: a code question asked before a run of episodes revisions is still
answered from the cache after it, and a question over both lanes runs only the lane that
moved. Answers stay those of the current revisions (KC-12).
"""

from __future__ import annotations

import asyncio

from knowledge_server._gen.knowledge.v1 import search_pb2
from knowledge_server.search.coordinator import Coordinator
from knowledge_server.search.lanes import LaneQuery, LaneResult, empty_lane
from knowledge_server.search.validate import validate_search


class _Lane:
    """A lane whose revision the test moves; one item naming the revision it came from."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rev = 1
        self.searches = 0

    def revision(self) -> str:
        return f"{self.name}-{self.rev}"

    async def search(self, q: LaneQuery) -> LaneResult:
        self.searches += 1
        lane = empty_lane(self.name)
        if self.name == "code":
            lane.capability = "full"
            lane.items.add(id=f"chunk:{self.rev}", chunk_id=str(self.rev), path="a.py")
        else:
            lane.items.add(id=f"ep:s:{self.rev}", session_id="s", seq=self.rev)
        return LaneResult(lane=lane)


def _ask(co: Coordinator, query: str, include: list[str]) -> search_pb2.SearchResponse:
    req = search_pb2.SearchRequest(schema="knowledge.search/v1", query=query, include=include)
    return asyncio.run(co.search(validate_search(req), None))


def test_a_moving_lane_leaves_the_other_lanes_cached_entries() -> None:
    episodes, code = _Lane("episodes"), _Lane("code")
    co = Coordinator({"episodes": episodes, "code": code}, cache_size=8)
    _ask(co, "where is the parser", ["code"])
    _ask(co, "who fixed the parser", ["episodes", "code"])
    assert code.searches == 2
    for i in range(20):  # live ingest: each question meets a new episodes revision
        episodes.rev += 1
        resp = _ask(co, f"what happened {i}", ["episodes"])
        assert resp.lanes.episodes.items[0].id == f"ep:s:{episodes.rev}"
    assert _ask(co, "where is the parser", ["code"]).lanes.code.items[0].id == "chunk:1"
    assert code.searches == 2, "the code question was evicted by dead episodes entries"
    # Over both lanes: the episodes lane runs again (its revision moved), code does not.
    searched = episodes.searches
    resp = _ask(co, "who fixed the parser", ["episodes", "code"])
    assert resp.lanes.episodes.items[0].id == f"ep:s:{episodes.rev}"
    assert episodes.searches == searched + 1
    assert code.searches == 2


def test_entries_of_a_passed_revision_leave_the_cache() -> None:
    episodes, code = _Lane("episodes"), _Lane("code")
    co = Coordinator({"episodes": episodes, "code": code}, cache_size=64)
    for i in range(5):
        _ask(co, f"question {i}", ["episodes"])
    _ask(co, "code question", ["code"])
    cached = len(co._cache)
    assert cached == 12  # a lane result and a whole answer per question
    episodes.rev += 1
    _ask(co, "question 0", ["episodes"])  # reads the new revision: the old entries go
    assert len(co._cache) == 2 + 2
    code.rev += 1
    _ask(co, "question 0", ["episodes"])  # a cache hit: no code revision read, none dropped
    assert len(co._cache) == 4
    assert _ask(co, "code question", ["code"]).lanes.code.items[0].id == "chunk:2"
    assert len(co._cache) == 4  # the code entries of revision 1 went, revision 2's came


def test_kc12_an_answer_with_a_failed_lane_is_not_replayed() -> None:
    """KC-12: an answer is served again only while it is still the answer. One where a lane
    timed out (a cold first read) was cached whole, and every identical search got the
    timeout again, the lane never asked, until some lane's revision moved."""

    class Episodes:
        name = "episodes"

        def revision(self) -> str:
            return "ep-r1"

        async def search(self, q: LaneQuery) -> LaneResult:
            lane = search_pb2.EpisodesLane(source="x", index_rev="ep-r1")
            lane.items.add(id="ev:1", session_id="s1", score=1.0)
            return LaneResult(lane=lane)

    class Code:
        name = "code"
        calls = 0

        def revision(self) -> str:
            return "code-r1"

        async def search(self, q: LaneQuery) -> LaneResult:
            Code.calls += 1
            if Code.calls == 1:
                await asyncio.sleep(0.5)  # longer than the lane's timeout, once
            lane = search_pb2.CodeLane(source="x", capability="full", index_rev="code-r1")
            lane.items.add(id="chunk:1", workspace="/w", path="a.py", score=1.0)
            return LaneResult(lane=lane)

    coord = Coordinator({"episodes": Episodes(), "code": Code()}, timeout_ms=100)
    v = validate_search(
        search_pb2.SearchRequest(
            schema="knowledge.search/v1", query="how to deploy", include=["episodes", "code"]
        )
    )

    async def ask() -> search_pb2.SearchResponse:
        return await coord.search(v, None)

    first = asyncio.run(ask())
    assert [e.code for e in first.errors] == ["KNOWLEDGE_LANE_TIMEOUT"]
    second = asyncio.run(ask())
    assert not second.errors and [i.path for i in second.lanes.code.items] == ["a.py"]
    assert Code.calls == 2


def test_kc12_a_derived_rebuild_renews_a_cached_answers_actors() -> None:
    """KC-12: a whole answer's actors come from the derived layer, which a rebuild moves
    after the episodes' revision moved. An episodes-only question asked between the two
    was cached with the old actors and served them until the next ingest; the derived
    revision is now part of the whole answer's key."""
    episodes = _Lane("episodes")
    derived = {"rev": "derived-1", "actor": "actor:old"}

    def build(resp: search_pb2.SearchResponse, v: object, ws: object) -> list[search_pb2.Actor]:
        return [search_pb2.Actor(actor_id=derived["actor"])]

    co = Coordinator(
        {"episodes": episodes},
        cache_size=8,
        actor_builder=build,  # type: ignore[arg-type]
        actors_revision=lambda: derived["rev"],
    )
    assert [a.actor_id for a in _ask(co, "who fixed it", ["episodes"]).actors] == ["actor:old"]
    derived.update(rev="derived-2", actor="actor:new")
    assert [a.actor_id for a in _ask(co, "who fixed it", ["episodes"]).actors] == ["actor:new"]
    # Unchanged, the answer is a cache hit again (the lane ran once per derived revision).
    assert [a.actor_id for a in _ask(co, "who fixed it", ["episodes"]).actors] == ["actor:new"]
    assert episodes.searches == 1
