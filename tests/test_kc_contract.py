"""knowledge_search v1 acceptance: KC-1..KC-13 (seed 000 §13), end to end over a real gRPC
server with real data: the real session logs and skills of ../shared/data, real workspaces
(copies of standard-library packages plus canary files), bearer tokens for two principals."""

from __future__ import annotations

import hashlib
import json
import shutil
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from knowledge_sdk import KnowledgeClient, search_request
from knowledge_sdk import types as v1
from knowledge_server.audit import AuditLog
from knowledge_server.auth import TokenStore
from knowledge_server.search.lanes import LaneQuery, LaneResult, LaneUnavailable, empty_lane
from structlog.testing import capture_logs

from tests.conftest import ServerThread

CANARY_A = "zebracanary alphaword"
CANARY_B = "yakcanary bravoword"
SECRET = "AKIA" + "QX7RT2ZK4LMN8PWE"  # an AWS access key id canary (KC-11)
SECRET_PASSWORD = "hunter2-canary-pass"


def _stdlib(name: str) -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / name


def _write_session(path: Path, session_id: str, cwd: Path, lines: list[tuple[str, str]]) -> None:
    with path.open("w") as f:
        for i, (role, text) in enumerate(lines, 1):
            f.write(
                json.dumps(
                    {
                        "session_id": session_id,
                        "seq": i,
                        "time": f"2026-10-2{i % 9}T09:00:00Z",
                        "cwd": str(cwd),
                        "harness": "generic",
                        "role": role,
                        "text": text,
                    }
                )
                + "\n"
            )


class World:
    def __init__(self, root: Path, shared: Path) -> None:
        self.root = root
        self.ws_a = root / "ws_a"
        self.ws_b = root / "ws_b"
        shutil.copytree(
            _stdlib("json"), self.ws_a / "json", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copytree(
            _stdlib("email") / "mime",
            self.ws_b / "mime",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        (self.ws_a / "billing.py").write_text(
            f'"""Billing helpers for {CANARY_A}."""\n\nAWS_ACCESS_KEY_ID = "{SECRET}"\n\n\n'
            "def charge_zebracanary(amount):\n    return amount * 2\n"
        )
        (self.ws_b / "shipping.py").write_text(
            f'"""Shipping helpers for {CANARY_B}."""\n\nDATABASE_URL = "postgres://app:{SECRET_PASSWORD}@db/ship"\n\n\n'
            "def ship_yakcanary(parcel):\n    return parcel\n"
        )
        self.logs = root / "logs"
        shutil.copytree(shared / "sessions", self.logs / "real")
        _write_session(
            self.logs / "a.jsonl",
            "sess-a",
            self.ws_a,
            [
                ("user", f"who fixed the {CANARY_A} billing bug?"),
                ("assistant", f"I fixed {CANARY_A} in billing.py; the key {SECRET} was rotated."),
            ],
        )
        _write_session(
            self.logs / "b.jsonl",
            "sess-b",
            self.ws_b,
            [
                ("user", f"please fix the {CANARY_B} shipping bug"),
                (
                    "assistant",
                    f"Fixed {CANARY_B}; connection postgres://app:{SECRET_PASSWORD}@db/ship works again.",
                ),
            ],
        )
        self.data = root / "data"
        tokens = TokenStore(self.data / "tokens.json")
        _, self.token_a = tokens.create("agent-a", "org", [str(self.ws_a)], "agent")
        _, self.token_b = tokens.create("agent-b", "org", [str(self.ws_b)], "agent")
        _, self.token_ops = tokens.create("ops", "org", None, "operator")
        self.sources_before = _tree_hash(self.logs) + _tree_hash(self.ws_a) + _tree_hash(self.ws_b)
        self.server = ServerThread(
            root,
            authenticate=tokens.authenticate,
            auth="on",
            workspaces=[str(self.ws_a), str(self.ws_b)],
            skill_roots=[str(shared / "skills")],
            lane_timeout_ms=5000,
        )
        with self.client(self.token_ops) as kc:
            for _ in kc.ingest_sessions([str(self.logs)]):
                pass
            for ws in (self.ws_a, self.ws_b):
                for _ in kc.index_workspace(str(ws)):
                    pass

    def client(self, token: str) -> KnowledgeClient:
        return KnowledgeClient(self.server.address, token=token, timeout=30)


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _db_state(data: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(data.glob("*.sqlite*"))
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("kc"), shared_data)
    yield w
    w.server.stop()


def _as_json(resp: v1.SearchResponse) -> dict:
    import betterproto2

    return resp.to_dict(casing=betterproto2.Casing.SNAKE, include_default_values=True)


class _FailingLane:
    def __init__(self, name: str, reason: str = "KNOWLEDGE_SOURCE_UNAVAILABLE") -> None:
        self.name = name
        self.reason = reason

    async def search(self, q: LaneQuery) -> LaneResult:
        raise LaneUnavailable(self.reason, "backend down")


class _SlowLane:
    def __init__(self, name: str, seconds: float) -> None:
        self.name = name
        self.seconds = seconds

    async def search(self, q: LaneQuery) -> LaneResult:
        import asyncio

        await asyncio.sleep(self.seconds)
        return LaneResult(lane=empty_lane(self.name))


class _ManyCodeLane:
    """A code backend with as many hits as it is asked for, each in its own file."""

    name = "code"

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def search(self, q: LaneQuery) -> LaneResult:
        self.asked.append(q.top_k)
        lane = empty_lane("code")
        lane.capability = "full"
        for i in range(q.top_k):
            lane.items.add(
                id=f"chunk:many{i}", chunk_id=f"many{i}", path=f"many/f{i}.py", start_line=1
            )
        return LaneResult(lane=lane)


class _swap:
    """Temporarily replace a lane of the running server (fault injection through the Lane interface)."""

    def __init__(self, world: World, **lanes: object) -> None:
        self.world, self.lanes, self.saved = world, lanes, {}

    def __enter__(self) -> None:
        for name, lane in self.lanes.items():
            self.saved[name] = self.world.server.app.coordinator.lanes[name]
            self.world.server.app.coordinator.lanes[name] = lane

    def __exit__(self, *exc: object) -> None:
        self.world.server.app.coordinator.lanes.update(self.saved)


def test_kc1_valid_request_has_schema_routing_lanes_fusion(world: World) -> None:
    with world.client(world.token_ops) as kc:
        resp = kc.search("who fixed the failing test", request_id="kc1")
    doc = _as_json(resp)
    assert doc["schema"] == "knowledge.search/v1" and doc["request_id"] == "kc1"
    assert doc["routing"]["intent"] == "find_agent" and doc["routing"]["lanes"]
    assert {"episodes", "code", "skills"} <= set(doc["lanes"])
    assert (
        doc["fusion"]["strategy"] == "rrf"
        and doc["fusion"]["k"] == 60
        and doc["fusion"]["dedup"] == "by id"
    )


def test_kc2_both_sources_alive_lanes_present_and_unmixed(world: World) -> None:
    with world.client(world.token_ops) as kc:
        resp = kc.search("fix the failing test where json decoder raises an error")
    assert resp.found and not resp.lanes.episodes.degraded and not resp.lanes.code.degraded
    assert resp.lanes.episodes.items and resp.lanes.code.items
    doc = _as_json(resp)
    for item in doc["lanes"]["episodes"]["items"]:
        assert "path" not in item and "start_line" not in item
    for item in doc["lanes"]["code"]["items"]:
        assert "session_id" not in item and "seq" not in item


def test_kc3_code_source_down_episodes_still_answer(world: World) -> None:
    """KC-3: the code source down -> code.degraded=true, episodes non-empty, and errors[]
    names the cause (the lane and its reason code), next to the seed's degradation warning."""
    with _swap(world, code=_FailingLane("code")), world.client(world.token_ops) as kc:
        resp = kc.search("who fixed the failing test")
    assert resp.lanes.code.degraded and not resp.lanes.code.items
    assert resp.lanes.code.degradation_reason.startswith("KNOWLEDGE_SOURCE_UNAVAILABLE")
    assert resp.lanes.code.empty_reason == "unavailable"
    assert resp.lanes.episodes.items and not resp.lanes.episodes.degraded
    causes = [(e.lane, e.code, e.message) for e in resp.errors]
    assert causes == [
        ("code", "KNOWLEDGE_SOURCE_UNAVAILABLE", "the code source failed: backend down")
    ]
    assert [(w.lane, w.code) for w in resp.warnings if w.lane == "code"] == [
        ("code", "KNOWLEDGE_LANE_DEGRADED")
    ]
    assert resp.found


class _CrashingLane:
    """A backend that fails with an exception whose text holds data (it must not leak)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def search(self, q: LaneQuery) -> LaneResult:
        raise RuntimeError(f"cannot parse {q.query!r}")


def test_kc3_a_crashing_lane_is_named_in_errors_by_its_type_only(world: World) -> None:
    """KC-3 with an unexpected exception: errors[] names the lane, KNOWLEDGE_SOURCE_UNAVAILABLE
    and the exception's type, never its text (which here holds the query)."""
    with _swap(world, code=_CrashingLane("code")), world.client(world.token_ops) as kc:
        resp = kc.search("who fixed the failing test qqvexcanary")
    assert [(e.lane, e.code) for e in resp.errors] == [("code", "KNOWLEDGE_SOURCE_UNAVAILABLE")]
    assert "RuntimeError" in resp.errors[0].message
    assert "qqvexcanary" not in json.dumps(
        {k: v for k, v in _as_json(resp).items() if k != "query"}
    )
    assert resp.lanes.code.degraded and resp.lanes.code.empty_reason == "unavailable"
    assert resp.lanes.episodes.items and resp.found


def test_kc3_slow_code_lane_times_out_and_degrades(world: World) -> None:
    world.server.app.coordinator.timeout_ms = 300
    try:
        with _swap(world, code=_SlowLane("code", 3.0)), world.client(world.token_ops) as kc:
            resp = kc.search("who fixed the failing test", trace=True)
    finally:
        world.server.app.coordinator.timeout_ms = 5000
    assert resp.lanes.code.degraded and "timeout" in resp.lanes.code.degradation_reason
    assert resp.lanes.code.empty_reason == "unavailable"
    # KC-3: errors[] names the cause: the lane's timeout.
    assert [(e.lane, e.code) for e in resp.errors] == [("code", "KNOWLEDGE_LANE_TIMEOUT")]
    assert "300 ms" in resp.errors[0].message
    assert resp.lanes.episodes.items
    assert {t.lane for t in resp.trace.lanes} >= {"episodes", "code"}


def test_kc4_episode_search_disabled_code_still_answers(world: World) -> None:
    with (
        _swap(world, episodes=_FailingLane("episodes", "SESSION_QUERY_SEARCH_DISABLED")),
        world.client(world.token_ops) as kc,
    ):
        resp = kc.search("where is the json decoder defined")
    assert resp.lanes.episodes.degraded
    assert resp.lanes.episodes.degradation_reason.startswith("SESSION_QUERY_SEARCH_DISABLED")
    assert [(e.lane, e.code) for e in resp.errors] == [
        ("episodes", "SESSION_QUERY_SEARCH_DISABLED")
    ]
    assert resp.lanes.code.items and not resp.lanes.code.degraded and resp.found


def test_kc5_both_sources_down_found_false_no_invented_items(world: World) -> None:
    with (
        _swap(world, episodes=_FailingLane("episodes"), code=_FailingLane("code")),
        world.client(world.token_ops) as kc,
    ):
        resp = kc.search("who fixed the failing test")
    assert resp.found is False
    assert any(e.code == "KNOWLEDGE_NO_SOURCE" for e in resp.errors)
    # Each failed lane is named too (KC-3), besides the answer's KNOWLEDGE_NO_SOURCE.
    assert {(e.lane, e.code) for e in resp.errors if e.lane} == {
        ("episodes", "KNOWLEDGE_SOURCE_UNAVAILABLE"),
        ("code", "KNOWLEDGE_SOURCE_UNAVAILABLE"),
    }
    assert (
        not resp.lanes.episodes.items and not resp.lanes.code.items and not resp.lanes.skills.items
    )
    assert not resp.actors


def test_kc6_every_item_carries_its_address(world: World) -> None:
    with world.client(world.token_ops) as kc:
        resp = kc.search("error handling in the decoder and failing tests", limit=20)
    assert resp.lanes.episodes.items and resp.lanes.code.items
    for it in resp.lanes.episodes.items:
        assert it.session_id and it.id == f"ep:{it.session_id}:{it.seq}"
    for it in resp.lanes.code.items:
        assert (
            it.path
            and it.start_line >= 1
            and it.end_line >= it.start_line
            and resp.lanes.code.index_rev
        )


def test_kc7_actor_evidence_points_only_at_items_in_the_response(world: World) -> None:
    with world.client(world.token_ops) as kc:
        resp = kc.search("who fixed the failing test", limit=10)
        small = kc.search("who fixed the failing test", limit=10, max_tokens=500)
    for r in (resp, small):
        ids = (
            {("episodes", i.id) for i in r.lanes.episodes.items}
            | {("code", i.id) for i in r.lanes.code.items}
            | {("skills", i.name) for i in r.lanes.skills.items}
        )
        for actor in r.actors:
            assert actor.evidence
            for ev in actor.evidence:
                assert (ev.lane, ev.id) in ids
    assert resp.actors, "real logs should yield actors for this question"


def test_kc8_rrf_weights_applied_and_order_stable(world: World) -> None:
    with world.client(world.token_ops) as kc:
        agent = kc.search("decoder error", mode="find_agent")
        code = kc.search("decoder error", mode="find_code")
    # Same lane ranks, different routing weights: scores scale by the weight (RRF weight/(60+rank)).
    assert agent.fusion.weights["code"] == pytest.approx(0.4) and code.fusion.weights[
        "code"
    ] == pytest.approx(1.0)
    a_items, c_items = agent.lanes.code.items, code.lanes.code.items
    assert [i.id for i in a_items] == [i.id for i in c_items]
    assert a_items
    for ia, ic in zip(a_items, c_items, strict=True):
        # ic.score = 1/(60 + rank) for the item's rank within the lane; the weight scales it.
        rank = round(1 / ic.score - 60)
        assert ic.score == pytest.approx(1.0 / (60 + rank), abs=1e-6)
        assert ia.score == pytest.approx(0.4 / (60 + rank), abs=1e-6)
    scores = [i.score for i in c_items]
    assert scores == sorted(scores, reverse=True)


def test_kc9_budget_never_exceeded_and_truncation_is_honest(world: World) -> None:
    from knowledge_server.search.coordinator import count_tokens

    with world.client(world.token_ops) as kc:
        big = kc.search(
            "json decoder error failing test", limit=50, max_tokens=20000, snippet_chars=1000
        )
        small = kc.search(
            "json decoder error failing test", limit=50, max_tokens=500, snippet_chars=1000
        )
    assert not big.limits.truncated and not big.limits.dropped
    assert small.limits.truncated and small.limits.dropped
    assert small.limits.budget.used_tokens <= 500
    # The server's count matches the response text it sent (proto JSON, proto field names).
    text = json.dumps(_server_json(small), ensure_ascii=False, separators=(",", ":"))
    assert count_tokens(text) == small.limits.budget.used_tokens
    kinds = {d.what for d in small.limits.dropped}
    assert "snippet" in kinds
    remaining = {i.id for i in small.lanes.episodes.items} | {i.id for i in small.lanes.code.items}
    returned_before = sum(len(getattr(big.lanes, n).items) for n in ("episodes", "code", "skills"))
    dropped_items = sum(
        d.count for d in small.limits.dropped if d.what == "item" and d.lane != "actors"
    )
    # Every item is either returned or named (or counted) as dropped.
    assert small.limits.returned + dropped_items == returned_before
    for d in small.limits.dropped:
        if d.what == "item" and d.id:
            assert d.id not in remaining
    # A large budget with the same question drops nothing.
    assert big.limits.returned == returned_before
    # Errors are never dropped.
    assert all(d.lane != "errors" for d in small.limits.dropped)


def _server_json(resp: v1.SearchResponse) -> dict:
    from google.protobuf import json_format
    from knowledge_server._gen.knowledge.v1 import search_pb2

    pb = search_pb2.SearchResponse.FromString(bytes(resp))
    return json_format.MessageToDict(pb, preserving_proto_field_name=True)


def test_kc10_workspace_filter_never_leaks(world: World) -> None:
    """Two principals, two workspaces, canaries: the query names the other workspace's second
    canary word; its first word, its paths, sessions and root must never come back."""
    with world.client(world.token_a) as a, world.client(world.token_b) as b:
        ra = a.search("bravoword shipping bug who fixed it", limit=50)
        rb = b.search("alphaword billing bug who fixed it", limit=50)
        widened = a.search("bravoword shipping", workspaces=[str(world.ws_b)], limit=50)
        own = a.search("alphaword billing", limit=50)
        status_a = a.get_status()
    for resp, foreign, foreign_ws, foreign_session, foreign_file in (
        (ra, "yakcanary", world.ws_b, "sess-b", "shipping.py"),
        (widened, "yakcanary", world.ws_b, "sess-b", "shipping.py"),
        (rb, "zebracanary", world.ws_a, "sess-a", "billing.py"),
    ):
        text = json.dumps(_as_json(resp))
        for leak in (foreign, str(foreign_ws), foreign_session, foreign_file):
            assert leak not in text, leak
    assert not widened.lanes.code.items and not widened.lanes.episodes.items
    # The caller's own data is found.
    assert any(i.session_id == "sess-a" for i in own.lanes.episodes.items)
    assert any(i.path == "billing.py" for i in own.lanes.code.items)
    # Counts are scoped too.
    assert own.lanes.episodes.counts.sessions == 1
    assert list(status_a.workspaces) == [str(world.ws_a)]
    # GetEpisode / GetChunk of the other workspace look like "not found".
    from knowledge_sdk import NotFound

    with world.client(world.token_ops) as ops:
        foreign_chunk = next(
            i
            for i in ops.search(CANARY_B, include=["code"]).lanes.code.items
            if i.path == "shipping.py"
        )
        foreign_ep = next(
            i
            for i in ops.search(CANARY_B, include=["episodes"]).lanes.episodes.items
            if i.session_id == "sess-b"
        )
    with world.client(world.token_a) as a:
        with pytest.raises(NotFound):
            a.get_chunk(foreign_chunk.chunk_id)
        with pytest.raises(NotFound):
            a.get_episode(foreign_ep.id)


def test_kc11_secret_canary_never_in_responses_or_logs(world: World) -> None:
    with capture_logs() as logs, world.client(world.token_ops) as kc:
        responses = [
            kc.search(f"{SECRET} access key", limit=50, snippet_chars=1000),
            kc.search(f"{SECRET_PASSWORD} postgres", limit=50, snippet_chars=1000),
            kc.search("billing aws access key id", limit=50, snippet_chars=1000),
            kc.search("connection postgres works again", limit=50, snippet_chars=1000),
        ]
        hits = [
            i
            for r in responses
            for i in r.lanes.code.items
            if i.path in ("billing.py", "shipping.py")
        ]
        eps = [
            i
            for r in responses
            for i in r.lanes.episodes.items
            if i.session_id in ("sess-a", "sess-b")
        ]
        full = [kc.get_chunk(i.chunk_id).chunk.text for i in hits] + [
            kc.get_episode(i.id).episode.text for i in eps
        ]
    assert hits and eps, "the canary files and sessions must be found (by their other words)"
    # The query echo is the caller's own text; everything the service produced must be clean.
    produced = [{k: v for k, v in _as_json(r).items() if k != "query"} for r in responses]
    blob = json.dumps(produced) + json.dumps(full) + json.dumps(logs, default=str)
    assert SECRET not in blob and SECRET_PASSWORD not in blob
    assert "[REDACTED:" in json.dumps(full)
    # The databases do not hold the secret either.
    for db in world.data.glob("*.sqlite*"):
        raw = db.read_bytes()
        assert SECRET.encode() not in raw and SECRET_PASSWORD.encode() not in raw, db.name


def test_kc12_same_index_rev_same_order(world: World) -> None:
    req = search_request("failing test error decoder", limit=20)
    with world.client(world.token_ops) as kc:
        first, second = kc.search(req), kc.search(req)
    assert first.lanes.code.index_rev == second.lanes.code.index_rev
    assert first.lanes.episodes.index_rev == second.lanes.episodes.index_rev
    for lane in ("episodes", "code", "skills"):
        assert [i.score for i in getattr(first.lanes, lane).items] == [
            i.score for i in getattr(second.lanes, lane).items
        ]
        key = "name" if lane == "skills" else "id"
        assert [getattr(i, key) for i in getattr(first.lanes, lane).items] == [
            getattr(i, key) for i in getattr(second.lanes, lane).items
        ]
    assert [a.actor_id for a in first.actors] == [a.actor_id for a in second.actors]


def test_kc13_lanes_write_only_their_own_store_and_sources_stay_unchanged(world: World) -> None:
    before = _db_state(world.data)
    with world.client(world.token_ops) as kc:
        for q in (
            "who fixed the failing test",
            "where is the json decoder",
            "test driven development skill",
        ):
            kc.search(q)
        assert _db_state(world.data) == before, "a search wrote to a database"
        for _ in kc.index_workspace(str(world.ws_a), full=True):
            pass
    after = _db_state(world.data)
    changed = {
        name.split(".sqlite")[0]
        for name in set(before) | set(after)
        if before.get(name) != after.get(name)
    }
    # The code lane writes its own store; the index is also recorded in the audit log.
    assert changed <= {"code", "audit"}, changed
    if "audit" in changed:
        log = AuditLog(world.data / "audit.sqlite")
        try:
            assert [e.operation for e in log.tail(1)] == ["index"]
        finally:
            log.close()
    # The harness logs and the workspaces were never modified.
    assert (
        _tree_hash(world.logs) + _tree_hash(world.ws_a) + _tree_hash(world.ws_b)
        == world.sources_before
    )


def test_kc_limit_up_to_50_is_honoured_by_every_lane_query(world: World) -> None:
    """Seed 000 §7.1: each lane returns its top K, 30 by default, before fusion; §3 allows
    limit 1..50, so above a limit of 15 a lane is asked for twice the limit and one with
    enough evidence fills it (a fixed pool of 30 used to cap the answer at 30)."""
    many = _ManyCodeLane()
    with _swap(world, code=many), world.client(world.token_ops) as kc:
        resp = kc.search(
            "json decoder", include=["code"], limit=50, max_tokens=20000, snippet_chars=80
        )
        small = kc.search("json encoder", include=["code"], limit=5)
        default = kc.search("json scanner", include=["code"])
        above = kc.search("json tool", include=["code"], limit=16)
    assert many.asked == [100, 30, 30, 32]
    assert len(resp.lanes.code.items) == 50 and not resp.limits.truncated
    assert len(small.lanes.code.items) == 5
    assert len(default.lanes.code.items) == 10 and len(above.lanes.code.items) == 16


def test_kc_a_lane_left_out_of_include_is_not_requested_not_degraded(world: World) -> None:
    """Seed 000 §4.1.1 keeps episodes and code in every answer; one the caller left out of
    ``include`` says so (empty_reason not_requested) and is neither degraded nor warned about."""
    with world.client(world.token_ops) as kc:
        code_only = kc.search("where is the json decoder defined", include=["code"])
        episodes_only = kc.search("who fixed the failing test", include=["episodes"])
    ep = code_only.lanes.episodes
    assert not ep.degraded and not ep.degradation_reason and ep.empty_reason == "not_requested"
    assert code_only.lanes.code.items and code_only.found
    code = episodes_only.lanes.code
    assert not code.degraded and not code.degradation_reason
    assert code.empty_reason == "not_requested" and not code.capability
    assert episodes_only.lanes.episodes.items and episodes_only.found
    for resp, absent in ((code_only, "episodes"), (episodes_only, "code")):
        assert not [n for n in (*resp.warnings, *resp.errors) if n.lane == absent]
    # Not asked for: the skills lane is absent (seed 000 §4.1.1: "skills if requested").
    assert not code_only.lanes.skills or not code_only.lanes.skills.source


def test_kc_empty_lanes_say_why_no_match_and_not_indexed(world: World) -> None:
    """Seed 000 §9: no "empty = all fine"; an empty lane carries its reason, so the
    zero-result rate is measurable from answers. Nothing matched (the caller's data was
    searched) is told apart from nothing indexed in the caller's workspaces; a question
    the code cannot answer (made-up words, a UUID, stopwords alone) gets no code items."""
    elsewhere = world.root / "ws_c"  # a folder with neither an index nor sessions
    elsewhere.mkdir(exist_ok=True)
    with world.client(world.token_ops) as ops, world.client(world.token_a) as a:
        nothing = ops.search("qqxvzrtk wwpfhjnb", include=["episodes", "code", "skills"])
        uuid_q = ops.search("3f2b8c1e-9d4a-4e7b-a1c5-7e9f0b2d6a48", include=["code"])
        stopwords = ops.search("what is this for", include=["code"], mode="find_code")
        no_path = ops.search("json decoder", include=["code"], paths=["no/such/dir"])
        unindexed = ops.search("json decoder", workspaces=[str(elsewhere)])
        foreign = a.search("json decoder", workspaces=[str(world.ws_b)])
        found = ops.search("where is the json decoder defined")
    assert not nothing.lanes.episodes.items and nothing.lanes.episodes.empty_reason == "no_match"
    assert not nothing.lanes.skills.items and nothing.lanes.skills.empty_reason == "no_match"
    # The code lane's relevance floor: made-up words and a UUID have no answer in the code
    # (the offline vectors alone would return ten chunks); the lane says so.
    # Nor does a question of stopwords alone: it names nothing to look for.
    for resp in (nothing, uuid_q, stopwords):
        assert not resp.lanes.code.items and resp.lanes.code.empty_reason == "no_match"
        assert not resp.lanes.code.degraded
    assert not no_path.lanes.code.items and no_path.lanes.code.empty_reason == "no_match"
    for resp in (unindexed, foreign):
        for name in ("episodes", "code", "skills"):
            lane = getattr(resp.lanes, name)
            assert not lane.items and lane.empty_reason == "not_indexed", (name, lane)
            assert not lane.degraded
    # A lane with items has no empty reason.
    assert found.lanes.code.items and found.lanes.code.empty_reason == ""
    assert found.lanes.episodes.items and found.lanes.episodes.empty_reason == ""


def test_kc_empty_lanes_say_why_index_empty(tmp_path: Path) -> None:
    """Seed 000 §9 on a fresh service: every lane is empty because its store holds nothing
    (index_empty, with KNOWLEDGE_INDEX_NOT_READY); a workspace indexed without a single
    chunk is an empty index too, not a failed search."""
    bare = tmp_path / "bare"
    bare.mkdir()
    server = ServerThread(tmp_path, workspaces=[str(bare)], skill_roots=[], lane_timeout_ms=5000)
    try:
        with KnowledgeClient(server.address, timeout=30) as kc:
            fresh = kc.search("where is the config loaded")
            for _ in kc.index_workspace(str(bare)):
                pass
            indexed = kc.search("where is the config loaded", include=["code"])
    finally:
        server.stop()
    for name in ("episodes", "code", "skills"):
        lane = getattr(fresh.lanes, name)
        assert lane.empty_reason == "index_empty" and lane.degraded, name
        assert lane.degradation_reason.startswith("KNOWLEDGE_INDEX_NOT_READY"), name
    assert {(w.lane, w.code) for w in fresh.warnings} >= {
        ("episodes", "KNOWLEDGE_INDEX_NOT_READY"),
        ("code", "KNOWLEDGE_INDEX_NOT_READY"),
        ("skills", "KNOWLEDGE_INDEX_NOT_READY"),
    }
    assert not fresh.found and [e.code for e in fresh.errors] == ["KNOWLEDGE_NO_SOURCE"]
    code = indexed.lanes.code
    assert code.index_rev and not code.degraded and not code.items
    assert code.empty_reason == "index_empty" and indexed.found
