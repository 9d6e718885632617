"""Lanes that complete their items after fusion (``LaneResult.finish``).

Invariants: the coordinator finishes exactly the items it returns, after dedup, the
diversity caps and the limit, and before budgeting (KC-6/KC-7 see finished items); a
cached lane result is finished again on its fresh copies; a finish that fails leaves the
ranked items in the answer and says so (KC-3: a lane problem degrades, never fails the
search).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from knowledge_server._gen.knowledge.v1 import search_pb2
from knowledge_server.search.coordinator import Coordinator
from knowledge_server.search.lanes import LaneQuery, LaneResult, empty_lane
from knowledge_server.search.validate import validate_search


class _TwoStepLane:
    """Ranks 20 code items (six share one path), describes the kept ones in ``finish``."""

    name = "code"

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.finished: list[list[str]] = []
        self.searches = 0

    def revision(self) -> str:
        return "rev-1"

    async def search(self, q: LaneQuery) -> LaneResult:
        self.searches += 1
        lane = empty_lane("code")
        lane.capability = "full"
        for i in range(20):
            path = "same.py" if i < 6 else f"f{i}.py"
            lane.items.add(id=f"chunk:c{i}", chunk_id=f"c{i}", path=path, start_line=i + 1)

        def finish(items: Sequence[search_pb2.CodeItem]) -> None:
            self.finished.append([it.id for it in items])
            if self.fail:
                raise RuntimeError("texts unavailable")
            for it in items:
                it.snippet = f"text of {it.chunk_id}"
                it.why.append("lex: described")

        return LaneResult(lane=lane, finish=finish)


class _Episodes:
    name = "episodes"

    async def search(self, q: LaneQuery) -> LaneResult:
        lane = empty_lane("episodes")
        lane.items.add(id="ep:s1:1", session_id="s1", seq=1, snippet="whole already")
        return LaneResult(lane=lane)


def _search(co: Coordinator, **fields: object) -> search_pb2.SearchResponse:
    req = search_pb2.SearchRequest(
        schema="knowledge.search/v1", query="where is it", include=["episodes", "code"]
    )
    for k, v in fields.items():
        setattr(req, k, v)
    return asyncio.run(co.search(validate_search(req), None))


def test_only_the_returned_items_are_finished_after_fusion() -> None:
    code = _TwoStepLane()
    resp = _search(Coordinator({"episodes": _Episodes(), "code": code}), limit=7)
    returned = [it.id for it in resp.lanes.code.items]
    # The per-path cap (5) dropped c5; the limit cut the rest.
    assert returned == [
        "chunk:c0",
        "chunk:c1",
        "chunk:c2",
        "chunk:c3",
        "chunk:c4",
        "chunk:c6",
        "chunk:c7",
    ]
    assert code.finished == [returned]
    assert all(it.snippet == f"text of {it.chunk_id}" for it in resp.lanes.code.items)
    assert all(list(it.why) == ["lex: described"] for it in resp.lanes.code.items)
    assert resp.lanes.episodes.items[0].snippet == "whole already"  # lanes without finish
    assert not resp.warnings


def test_a_cached_lane_result_is_finished_again() -> None:
    code = _TwoStepLane()
    co = Coordinator({"episodes": _Episodes(), "code": code})
    first = _search(co, limit=3)
    # Another limit: another answer, the same lane query (top_k 30) from the lane cache.
    second = _search(co, limit=4, trace=True)
    assert code.searches == 1
    assert [t.cache_hit for t in second.trace.lanes if t.lane == "code"] == [True]
    assert code.finished == [
        [it.id for it in first.lanes.code.items],
        [it.id for it in second.lanes.code.items],
    ]
    assert all(it.snippet for it in second.lanes.code.items)


def test_a_failing_finish_leaves_the_ranked_items_and_says_so() -> None:
    resp = _search(Coordinator({"episodes": _Episodes(), "code": _TwoStepLane(fail=True)}), limit=3)
    assert [it.id for it in resp.lanes.code.items] == ["chunk:c0", "chunk:c1", "chunk:c2"]
    assert all(it.snippet == "" for it in resp.lanes.code.items)
    notices = [(w.code, w.lane) for w in resp.warnings]
    assert ("KNOWLEDGE_LANE_DEGRADED", "code") in notices
    assert resp.found
