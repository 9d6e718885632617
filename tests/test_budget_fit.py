"""KC-9 as a property: for any response and any budget, the fitted response states its
true size and never exceeds the budget unless only what may not be dropped is left.

The coordinator measures the text once and then tracks removals by arithmetic; these
cases check that bookkeeping against the real serialiser."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server._gen.knowledge.v1 import errors_pb2, search_pb2
from knowledge_server.search.coordinator import _fit_budget, count_tokens
from knowledge_server.search.jsonsize import json_text

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
    _fit_budget(resp, max_tokens)
    used = resp.limits.budget.used_tokens
    assert used == count_tokens(json_text(resp))
    remaining = sum(len(getattr(resp.lanes, n).items) for n in ("episodes", "code", "skills"))
    assert resp.limits.returned == remaining
    if remaining:
        # Items are only removed while the text is over budget.
        assert used <= max_tokens
    dropped = sum(d.count for d in resp.limits.dropped if d.what == "item" and d.lane != "actors")
    assert remaining + dropped == items_before
    assert resp.limits.truncated == bool(resp.limits.dropped)
