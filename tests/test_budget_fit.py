"""KC-9 as a property: for any response and any budget, the fitted response states its
true size and never exceeds the budget unless only what may not be dropped is left.

The coordinator measures the text once and then tracks removals by arithmetic; these
cases check that bookkeeping against the real serialiser."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server._gen.knowledge.v1 import errors_pb2, search_pb2
from knowledge_server.search.coordinator import _fit_budget, count_tokens
from knowledge_server.search.jsonlen import json_text

_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300
) | st.sampled_from(
    [
        "",
        "def decode(self, s):\n    return x",
        'quote " and \\ slash',
        "кто чинил доступ",
        "会员退款多久到账",
    ]
)


@st.composite
def responses(draw: st.DrawFn) -> search_pb2.SearchResponse:
    resp = search_pb2.SearchResponse(schema="knowledge.search/v1", found=True)
    resp.limits.budget.max_tokens = 1
    ids = []
    for n in range(draw(st.integers(0, 25))):
        it = resp.lanes.episodes.items.add(
            id=f"ep:{n}", session_id=f"s{n % 4}", seq=n, snippet=draw(_TEXT)
        )
        it.score = draw(st.floats(0, 1))
        ids.append(("episodes", it.id))
    for n in range(draw(st.integers(0, 25))):
        it = resp.lanes.code.items.add(
            id=f"chunk:{n}", path=f"src/m{n}.py", start_line=n + 1, end_line=n + 9
        )
        it.snippet = draw(_TEXT)
        it.why.extend(["lex: a b", "vec: 0.50"])
        it.score = draw(st.floats(0, 1))
        ids.append(("code", it.id))
    for n in range(draw(st.integers(0, 8))):
        it = resp.lanes.skills.items.add(name=f"skill-{n}", description=draw(_TEXT))
        ids.append(("skills", it.name))
    for lane in (resp.lanes.episodes, resp.lanes.code, resp.lanes.skills):
        # A lane of items only: removing its last item leaves '{}', no comma to take.
        if draw(st.booleans()):
            lane.source = "knowledge.test"
    for n in range(draw(st.integers(0, 6))):
        actor = resp.actors.add(actor_id=f"actor:{n}", kind="root_session", score=0.5)
        for lane, item_id in draw(st.lists(st.sampled_from(ids), max_size=4)) if ids else []:
            actor.evidence.add(lane=lane, id=item_id)
    if draw(st.booleans()):
        resp.errors.append(errors_pb2.Notice(code="KNOWLEDGE_LANE_DEGRADED", message=draw(_TEXT)))
    resp.limits.returned = sum(
        len(getattr(resp.lanes, n).items) for n in ("episodes", "code", "skills")
    )
    return resp


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resp=responses(), max_tokens=st.integers(500, 6000))
def test_kc9_fitted_response_states_its_true_size(
    resp: search_pb2.SearchResponse, max_tokens: int
) -> None:
    resp.limits.budget.max_tokens = max_tokens
    items_before = resp.limits.returned
    had = {n for n in ("episodes", "code", "skills") if getattr(resp.lanes, n).items}
    _fit_budget(resp, max_tokens)
    used = resp.limits.budget.used_tokens
    assert used == count_tokens(json_text(resp))
    # A lane the budget emptied says so (seed 000 §9: an empty lane carries its reason).
    for n in had:
        lane = getattr(resp.lanes, n)
        assert lane.empty_reason == ("" if lane.items else "budget"), n
    remaining = sum(len(getattr(resp.lanes, n).items) for n in ("episodes", "code", "skills"))
    assert resp.limits.returned == remaining
    if remaining:
        # Items are only removed while the text is over budget.
        assert used <= max_tokens
    dropped = sum(d.count for d in resp.limits.dropped if d.what == "item" and d.lane != "actors")
    assert remaining + dropped == items_before
    assert resp.limits.truncated == bool(resp.limits.dropped)


def test_kc9_many_removals_are_counted_not_named() -> None:
    """KC-9 with a large limit and a small budget: the first removals are named (lane,
    id), the rest counted per lane, so the list of removals never crowds out the items.
    Naming every removal once left 0 of 100 items for limit=50 (each name took the room an
    item had freed)."""
    from knowledge_server.search.coordinator import MAX_NAMED_DROPS

    resp = search_pb2.SearchResponse(schema="knowledge.search/v1", found=True)
    for n in range(50):
        it = resp.lanes.episodes.items.add(
            id=f"ep:session-{n:03d}:{n}", session_id=f"session-{n:03d}", seq=n
        )
        it.score = 1.0 - n / 100
        it.why.append("fts: match in assistant/message")
        code = resp.lanes.code.items.add(
            id=f"chunk:{n:040d}", path=f"pkg/module_{n}.py", start_line=n, end_line=n + 30
        )
        code.score = 0.99 - n / 100
        code.why.extend(["lex: decoder json", "vec: 0.41"])
        actor = resp.actors.add(actor_id=f"actor:root_session:session-{n:03d}", score=0.5)
        actor.evidence.add(lane="episodes", id=it.id)
    resp.limits.returned = 100
    _fit_budget(resp, 2000)
    used = resp.limits.budget.used_tokens
    assert used == count_tokens(json_text(resp)) and used <= 2000
    remaining = len(resp.lanes.episodes.items) + len(resp.lanes.code.items)
    assert remaining >= 20  # about what 2,000 tokens hold
    named = [d for d in resp.limits.dropped if d.what == "item" and d.id]
    counted = [d for d in resp.limits.dropped if d.what == "item" and not d.id]
    assert not named and counted  # past the cap, every item entry is a count
    assert len(resp.limits.dropped) <= 3  # episodes, code, actors
    items_dropped = sum(d.count for d in counted if d.lane != "actors")
    assert remaining + items_dropped == 100
    actors_dropped = sum(d.count for d in counted if d.lane == "actors")
    assert len(resp.actors) + actors_dropped == 50
    assert MAX_NAMED_DROPS < items_dropped


def test_kc9_few_removals_are_named() -> None:
    """A small trim still names what it removed."""
    resp = search_pb2.SearchResponse(schema="knowledge.search/v1", found=True)
    for n in range(12):
        it = resp.lanes.code.items.add(id=f"chunk:{n}", path="src/" + "d/" * 150 + f"m{n}.py")
        it.snippet = "x" * 600
        it.score = 1.0 - n / 100
    resp.limits.returned = 12
    _fit_budget(resp, 500)
    named = [d.id for d in resp.limits.dropped if d.what == "item"]
    assert 0 < len(named) <= 10 and all(d.startswith("chunk:") for d in named)
    assert len(resp.lanes.code.items) + len(named) == 12
    assert resp.limits.budget.used_tokens == count_tokens(json_text(resp)) <= 500


class _CodeLane:
    """A code lane answering every question with one item per snippet length given, each
    scored below the one before (a fixed revision: its answers are cached)."""

    name = "code"

    def __init__(self, snippet_lengths: list[int]) -> None:
        self.snippet_lengths = snippet_lengths

    def revision(self) -> str:
        return "rev-1"

    async def search(self, q: object) -> object:
        from knowledge_server.search.lanes import LaneResult, empty_lane

        lane = empty_lane("code")
        lane.capability = "full"
        for i, n in enumerate(self.snippet_lengths):
            it = lane.items.add(id=f"chunk:c{i}", path=f"f{i}.py", start_line=i + 1)
            it.snippet = "y" * n
            it.score = 1.0 - i / 50
        return LaneResult(lane=lane)


def test_kc9_cached_answer_is_fitted_once() -> None:
    """KC-9 for cache hits: a repeated question (here with trace, which makes the answer
    longer) is fitted from the unfitted answer, like a fresh one: one budget notice, and
    the snippet counts name every item that lost its snippet."""
    import asyncio

    from knowledge_server.search.coordinator import Coordinator
    from knowledge_server.search.validate import validate_search

    co = Coordinator({"code": _CodeLane([400] * 10)})

    def ask(trace: bool) -> search_pb2.SearchResponse:
        req = search_pb2.SearchRequest(
            schema="knowledge.search/v1", query="where is it", include=["code"], trace=trace
        )
        req.budget.max_tokens = 900
        return asyncio.run(co.search(validate_search(req), None))

    for resp in (ask(False), ask(True), ask(True)):
        notices = [w for w in resp.warnings if w.code == "KNOWLEDGE_BUDGET_EXCEEDED"]
        assert len(notices) == 1
        bare = sum(1 for it in resp.lanes.code.items if not it.snippet)
        counted = sum(d.count for d in resp.limits.dropped if d.what == "snippet")
        assert bare == counted > 0
        assert resp.limits.budget.used_tokens == count_tokens(json_text(resp)) <= 900
    assert ask(True).trace.lanes[0].cache_hit


def test_kc12_cached_answer_is_what_a_fresh_run_returns() -> None:
    """KC-12 for whole answers: a repeated question returns what a coordinator without a
    cache returns for the same call, whatever the call's request id (its length moves the
    budget cut); with a trace too, it is fitted within the budget (KC-9), and every hit
    carries its own observation time. Calls whose request id takes the room the first
    call's took get the fitted copy as it is (no second fitting)."""
    import asyncio
    from datetime import UTC, datetime

    from knowledge_server.search import coordinator as co_mod
    from knowledge_server.search.coordinator import Coordinator
    from knowledge_server.search.lanes import LaneQuery, LaneResult, empty_lane
    from knowledge_server.search.validate import validate_search

    class _Episodes:
        name = "episodes"

        def revision(self) -> str:
            return "ev-1"

        async def search(self, q: LaneQuery) -> LaneResult:
            lane = empty_lane("episodes")
            for i in range(6):
                it = lane.items.add(id=f"s1:{i}", session_id="s1", seq=i, snippet="z" * 120)
                it.score = 0.9 - i / 40
                it.time.FromDatetime(datetime(2026, 1, 1, tzinfo=UTC))
            return LaneResult(lane=lane)

    lanes = {"code": _CodeLane([150 + 7 * i for i in range(8)]), "episodes": _Episodes()}
    cached, fresh = Coordinator(dict(lanes)), Coordinator(dict(lanes), cache_size=0)
    fits = []
    real_fit = co_mod._fit_budget

    def counting_fit(resp: search_pb2.SearchResponse, max_tokens: int) -> None:
        fits.append(max_tokens)
        real_fit(resp, max_tokens)

    def ask(
        co: Coordinator, rid: str, trace: bool, include: list[str]
    ) -> tuple[search_pb2.SearchResponse, int]:
        """The answer without its observation time, and that time's width in the text
        (0, 3, 6 or 9 fraction digits: the clock decides, and the budget counts it)."""
        req = search_pb2.SearchRequest(
            schema="knowledge.search/v1",
            query="where is it",
            include=include,
            trace=trace,
            request_id=rid,
        )
        req.budget.max_tokens = 700
        before = datetime.now(UTC).replace(microsecond=0)
        resp = asyncio.run(co.search(validate_search(req), None))
        assert resp.limits.budget.used_tokens == count_tokens(json_text(resp)) <= 700
        # The observation time is the call's own; times differ between runs, nothing else.
        assert resp.lanes.episodes.observed_at.ToDatetime(tzinfo=UTC) >= before
        width = len(resp.lanes.episodes.observed_at.ToJsonString())
        resp.lanes.episodes.ClearField("observed_at")
        for t in resp.trace.lanes:
            t.ms, t.cache_hit = 0.0, False
        resp.trace.total_ms = 0.0
        return resp, width

    co_mod._fit_budget = counting_fit
    try:
        for include in (["code"], ["code", "episodes"]):
            _, first_width = ask(cached, "first", False, include)
            for n in (0, 1, 5, 9, 17, 33, 64, 128):
                for trace in (False, True):
                    rid = "r" * n
                    for _ in range(5):  # until both times take the same room
                        (hit, hit_width), (want, want_width) = (
                            ask(cached, rid, trace, include),
                            ask(fresh, rid, trace, include),
                        )
                        if hit_width == want_width:
                            break
                    if not trace:  # (a trace's times are the call's own, and take room)
                        assert hit == want, (include, n)
            fits.clear()
            # As long as "first", and at a time that takes the same room: the fitted copy.
            # (The clock may print another number of fraction digits: then it is refitted.)
            _, width = ask(cached, "12345", False, include)
            assert fits == ([] if width == first_width else [700])
            fits.clear()
            ask(cached, "123456", False, include)  # longer: fitted again
            assert fits == [700]
    finally:
        co_mod._fit_budget = real_fit
