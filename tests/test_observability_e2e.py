"""Metrics, traces and the call log over a real server on a free port.

- Prometheus: the endpoint is scraped over HTTP after real calls, and the numbers that
  those calls must have moved are checked (per RPC and code, per lane, per answer,
  operator streams, the licence, edition refusals).
- OpenTelemetry: with the SDK's in-memory exporter, a Search has one server span with
  one child span per lane, carrying ids and counts and never the query; an untraced
  call has no span, and its lanes none either.
- Logs: a search body's request_id is the id of that call's log line; a partial answer
  is logged at warning level with its codes, never its text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import structlog
from knowledge_sdk import AsyncKnowledgeClient, EditionRefused, RPCError
from knowledge_server._gen.knowledge.v1 import index_service_pb2, index_service_pb2_grpc
from knowledge_server.auth import TokenStore
from knowledge_server.config import ConfigError, load_config
from knowledge_server.metrics import Metrics
from knowledge_server.runtime import build_app
from knowledge_server.server import create_server, shutdown, start_served
from knowledge_server.tracing import Tracing, provider_with
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, SamplingResult
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import LogCapture

from tests.conftest import LicenceVendor, dev_keys, start_server, write_session_log

WORD = "wombatcodec"
CANARY = "CANARY-OBS-51c2"


def _workspace(tmp_path: Path, files: int = 3) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(files):
        doc = " ".join(f"the {WORD} step {i}.{j} decodes frames and checks sizes" for j in range(8))
        (ws / f"codec_{i}.py").write_text(
            f"def {WORD}_decode_{i}(frame):\n    '''{doc}'''\n    return frame[{i}:]\n"
        )
        # As many files without the word: ranking needs words that tell files apart.
        (ws / f"util_{i}.py").write_text(f"def add_{i}(a, b):\n    return a + b + {i}\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    write_session_log(logs / "s1.jsonl", "s-obs-1", ws, f"the {WORD} decoder drops frames")
    return ws, logs


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def _scrape_once_counted(
    port: int, name: str, **labels: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A scrape taken once the last call is counted: a refused call's status reaches the
    client before the server's interceptor has counted it, and a scrape that blocked the
    event loop kept it from doing so. The scrape runs in a thread; at most 5 s."""
    samples = await asyncio.to_thread(_scrape, port)
    for _ in range(250):
        if _value(samples, name, **labels):
            break
        await asyncio.sleep(0.02)
        samples = await asyncio.to_thread(_scrape, port)
    return samples


SEARCH = "/knowledge.v1.KnowledgeService/Search"


def _recorded(sampler: Sampler | None = None) -> tuple[InMemorySpanExporter, Tracing]:
    """Tracing whose spans are kept in memory as each ends (``sampler``: every call when
    None)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, Tracing(provider)


async def test_metrics_move_with_real_calls(tmp_path: Path) -> None:
    ws, logs = _workspace(tmp_path, files=30)
    rs = await start_server(
        tmp_path, workspaces=[str(ws)], session_paths=[str(logs)], metrics_listen="127.0.0.1:0"
    )
    endpoint = rs.served.metrics_endpoint
    assert endpoint is not None and endpoint.host == "127.0.0.1"
    try:
        before = _scrape(endpoint.port)
        assert _value(before, "knowledge_rpc_calls_total", method=SEARCH, code="OK") == 0
        async with AsyncKnowledgeClient(rs.address) as kc:
            # Before any ingest: the episodes lane is degraded (index not ready).
            await kc.search(f"{WORD} decoder")
            async for _ in kc.index_workspace(str(ws)):
                pass
            async for _ in kc.ingest_sessions([str(logs)]):
                pass
            both = await kc.search(f"{WORD} decoder frames")
            again = await kc.search(f"{WORD} decoder frames")
            nothing = await kc.search("zebrafishquantum", include=["code"])
            big = await kc.search(
                f"{WORD} decode frames", include=["code"], limit=50, max_tokens=500
            )
            try:
                await kc.themes()
            except EditionRefused:
                pass
            else:
                raise AssertionError("Community answered a doc-graph call")
        assert both.lanes.code.items and both.lanes.episodes.items
        assert again.lanes.code == both.lanes.code
        assert not nothing.lanes.code.items
        assert big.limits.truncated
        m = await _scrape_once_counted(
            endpoint.port,
            "knowledge_rpc_calls_total",
            method="/knowledge.v1.DocGraphService/Themes",
            code="PERMISSION_DENIED",
        )
    finally:
        await shutdown(rs.served, 0)

    assert _value(m, "knowledge_rpc_calls_total", method=SEARCH, code="OK") == 5
    assert _value(m, "knowledge_rpc_duration_seconds_count", method=SEARCH, code="OK") == 5
    themes = "/knowledge.v1.DocGraphService/Themes"
    assert _value(m, "knowledge_rpc_calls_total", method=themes, code="PERMISSION_DENIED") == 1
    assert _value(m, "knowledge_edition_refusals_total", feature="doc-graph", method=themes) == 1
    index = "/knowledge.v1.IndexService/IndexWorkspace"
    assert _value(m, "knowledge_rpc_calls_total", method=index, code="OK") == 1
    # Lanes: four searches ran the code lane (the repeated one was answered whole from
    # the cache); the first one, before the index and the ingest, found both empty.
    assert _value(m, "knowledge_lane_answers_total", lane="code") == 4
    assert _value(m, "knowledge_lane_duration_seconds_count", lane="code") == 4
    # Two without items, each with its reason: before the index, and no match.
    zero = "knowledge_lane_zero_results_total"
    assert _value(m, zero, lane="code", reason="index_empty") == 1
    assert _value(m, zero, lane="code", reason="no_match") == 1
    assert (
        _value(
            m,
            "knowledge_lane_degradations_total",
            lane="episodes",
            reason="KNOWLEDGE_INDEX_NOT_READY",
        )
        == 1
    )
    assert _value(m, "knowledge_lane_timeouts_total", lane="code") == 0
    # Answers: five, two with both kinds of evidence (one of them from the cache), one
    # cut by its budget.
    assert _value(m, "knowledge_search_answers_total") == 5
    assert _value(m, "knowledge_search_answers_with_code_and_episodes_total") == 2
    assert _value(m, "knowledge_search_cache_hits_total") == 1
    assert _value(m, "knowledge_search_budget_truncations_total") == 1
    # Operator streams: counters of their summaries, time and last success.
    assert _value(m, "knowledge_operation_runs_total", operation="index", outcome="ok") == 1
    assert (
        _value(m, "knowledge_operation_items_total", operation="index", counter="files_indexed")
        == 60
    )
    assert _value(m, "knowledge_operation_items_total", operation="ingest", counter="sessions") == 1
    assert _value(m, "knowledge_operation_seconds_total", operation="index") > 0
    assert _value(m, "knowledge_operation_last_success_timestamp_seconds", operation="ingest") > 0
    assert _value(m, "knowledge_licence_info", edition="community", licence_state="missing") == 1
    assert WORD not in json.dumps([list(k) for k in m])


async def _counted(metrics: Metrics, method: str, code: str) -> float:
    """Calls of ``method`` counted under ``code``, once there is one: a call cut off is
    counted when the server's handler has unwound, after its caller saw its status. At
    most 5 s."""
    labels = {"method": method, "code": code}
    for _ in range(250):
        value = metrics.registry.get_sample_value("knowledge_rpc_calls_total", labels)
        if value:
            return value
        await asyncio.sleep(0.02)
    return 0.0


async def test_a_call_past_its_deadline_is_counted_deadline_exceeded_not_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC ends a call at its caller's deadline by cancelling its handler, as it does a
    call its caller cancelled; the metrics and the span carry what the caller got."""
    cfg = load_config(
        env={},
        overrides={
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp_path / "data"),
            "bootstrap": False,
        },
    )
    app = build_app(cfg)
    entered: asyncio.Queue[str] = asyncio.Queue()

    # Work that never ends and never looks at the deadline: only gRPC ends these calls.
    async def held_status(*args: Any) -> Any:
        await entered.put("status")
        await asyncio.Event().wait()

    async def held_stream(*args: Any) -> Any:
        await entered.put("index")
        await asyncio.Event().wait()
        yield  # pragma: no cover - never reached

    monkeypatch.setattr(app, "status", held_status)
    monkeypatch.setattr(app, "index_stream", held_stream)
    metrics = Metrics()
    exporter, tracing = _recorded()
    served = await create_server(cfg, app, metrics=metrics, tracing=tracing)
    await served.server.start()
    status = "/knowledge.v1.IndexService/GetStatus"
    index = "/knowledge.v1.IndexService/IndexWorkspace"
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)
            stub = index_service_pb2_grpc.IndexServiceStub(channel)
            # Deadlines long enough for a loaded machine to reach the held work first.
            with pytest.raises(grpc.aio.AioRpcError) as unary_late:
                await stub.GetStatus(index_service_pb2.GetStatusRequest(), timeout=1.0)
            with pytest.raises(grpc.aio.AioRpcError) as stream_late:
                async for _ in stub.IndexWorkspace(
                    index_service_pb2.IndexWorkspaceRequest(root=str(tmp_path)), timeout=1.0
                ):
                    pass
            # The same calls cancelled by their callers, well before their deadlines.
            unary = stub.GetStatus(index_service_pb2.GetStatusRequest(), timeout=60)
            stream = stub.IndexWorkspace(
                index_service_pb2.IndexWorkspaceRequest(root=str(tmp_path)), timeout=60
            )
            for _ in range(4):
                await asyncio.wait_for(entered.get(), 30)
            unary.cancel()
            stream.cancel()
            late = (
                await _counted(metrics, status, "DEADLINE_EXCEEDED"),
                await _counted(metrics, index, "DEADLINE_EXCEEDED"),
            )
            cancelled = (
                await _counted(metrics, status, "CANCELLED"),
                await _counted(metrics, index, "CANCELLED"),
            )
    finally:
        await shutdown(served, 0)
    assert unary_late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert stream_late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert late == (1, 1)
    assert cancelled == (1, 1)

    def runs(outcome: str) -> float | None:
        return metrics.registry.get_sample_value(
            "knowledge_operation_runs_total", {"operation": "index", "outcome": outcome}
        )

    assert (runs("deadline_exceeded"), runs("cancelled"), runs("failed")) == (1, 1, None)
    codes = sorted(
        (s.name, (s.attributes or {}).get("rpc.grpc.status_code"))
        for s in exporter.get_finished_spans()
    )
    assert codes == [
        ("knowledge.v1.IndexService/GetStatus", "CANCELLED"),
        ("knowledge.v1.IndexService/GetStatus", "DEADLINE_EXCEEDED"),
        ("knowledge.v1.IndexService/IndexWorkspace", "CANCELLED"),
        ("knowledge.v1.IndexService/IndexWorkspace", "DEADLINE_EXCEEDED"),
    ]


async def test_edition_refusals_count_only_callers_the_edition_refuses(tmp_path: Path) -> None:
    """A call refused for its token (none, a bad one) or its role never reaches the
    edition gate: the caller gets that refusal, and no edition refusal is counted."""
    store = TokenStore(tmp_path / "data" / "tokens.json")
    _, agent = store.create("agent-1", "org-a", None, "agent")
    _, operator = store.create("ops-1", "org-a", None, "operator")
    rs = await start_server(
        tmp_path, authenticate=store.authenticate, auth="on", metrics_listen="127.0.0.1:0"
    )
    metrics = rs.served.metrics
    assert metrics is not None
    got: list[str] = []

    async def themes(token: str | None) -> None:
        async with AsyncKnowledgeClient(rs.address, token=token) as kc:
            try:
                await kc.themes()
            except RPCError as exc:
                got.append(f"themes {type(exc).__name__}")

    async def build(token: str) -> None:
        async with AsyncKnowledgeClient(rs.address, token=token) as kc:
            try:
                async for _ in kc.build_doc_graph():
                    pass
            except RPCError as exc:
                got.append(f"build {type(exc).__name__}")

    try:
        await themes(None)
        await themes("kn_" + "x" * 43)
        await build(agent)  # an agent may not build
        await themes(agent)
        await build(operator)
        # Each call is counted once the server's interceptor has unwound (at most 5 s).
        for _ in range(250):
            done = sum(
                sample.value
                for family in metrics.rpc_calls.collect()
                for sample in family.samples
                if sample.name == "knowledge_rpc_calls_total"
            )
            if done >= 5:
                break
            await asyncio.sleep(0.02)
    finally:
        await shutdown(rs.served, 0)
    assert got == [
        "themes Unauthenticated",
        "themes Unauthenticated",
        "build PermissionDenied",
        "themes EditionRefused",
        "build EditionRefused",
    ]

    def refusals(method: str) -> float | None:
        return metrics.registry.get_sample_value(
            "knowledge_edition_refusals_total", {"feature": "doc-graph", "method": method}
        )

    assert refusals("/knowledge.v1.DocGraphService/Themes") == 1
    assert refusals("/knowledge.v1.IndexService/BuildDocGraph") == 1


async def test_a_dispatch_is_no_search_answer_to_the_metrics(tmp_path: Path) -> None:
    """A dispatch searches to plan; that search is not one a Search caller got, so it
    moves neither the search answers nor the lanes' counts, and a Search still does."""
    ws, logs = _workspace(tmp_path)
    rs = await start_server(
        tmp_path, workspaces=[str(ws)], session_paths=[str(logs)], metrics_listen="127.0.0.1:0"
    )
    metrics = rs.served.metrics
    assert metrics is not None
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            for i in range(3):  # dry runs
                await kc.dispatch(f"fix the {WORD} decoder, step {i}")
            await kc.search(f"{WORD} decoder", include=["episodes", "code"])
    finally:
        await shutdown(rs.served, 0)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("knowledge_search_answers_total") == 1
    assert value("knowledge_lane_answers_total", lane="episodes") == 1
    assert value("knowledge_lane_answers_total", lane="code") == 1
    assert value("knowledge_lane_answers_total", lane="skills") is None
    dispatch = "/knowledge.v1.KnowledgeService/Dispatch"
    assert value("knowledge_rpc_calls_total", method=dispatch, code="OK") == 3


async def test_metrics_report_the_licence_days_to_expiry(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    from datetime import timedelta

    licence_vendor.install(
        tmp_path / "data", licence_vendor.issue(expires_at=timedelta(days=30, hours=12))
    )
    rs = await start_server(tmp_path, metrics_listen="127.0.0.1:0", **dev_keys(tmp_path / "data"))
    try:
        assert rs.served.metrics_endpoint is not None
        m = _scrape(rs.served.metrics_endpoint.port)
    finally:
        await shutdown(rs.served, 0)
    assert _value(m, "knowledge_licence_info", edition="enterprise", licence_state="valid") == 1
    assert 30 < _value(m, "knowledge_licence_days_to_expiry") < 31


async def test_metrics_are_off_by_default(tmp_path: Path) -> None:
    rs = await start_server(tmp_path)
    try:
        assert rs.served.metrics is None and rs.served.metrics_endpoint is None
        assert rs.served.tracing is None
        assert rs.app.coordinator.observers == []
    finally:
        await shutdown(rs.served, 0)


@asynccontextmanager
async def _traced_and_indexed(
    tmp_path: Path,
) -> AsyncIterator[tuple[InMemorySpanExporter, AsyncKnowledgeClient]]:
    """A traced server with the workspace indexed and the logs ingested; the spans so far
    cleared, a client to it."""
    ws, logs = _workspace(tmp_path)
    exporter, tracing = _recorded()
    cfg = load_config(
        env={},
        overrides={
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp_path / "data"),
            "bootstrap": False,
            "workspaces": [str(ws)],
            "session_paths": [str(logs)],
        },
    )
    served = await create_server(cfg, build_app(cfg), tracing=tracing)
    await served.server.start()
    try:
        async with AsyncKnowledgeClient(f"127.0.0.1:{served.port}") as kc:
            async for _ in kc.index_workspace(str(ws)):
                pass
            async for _ in kc.ingest_sessions([str(logs)]):
                pass
            exporter.clear()
            yield exporter, kc
    finally:
        await shutdown(served, 0)


async def test_a_search_is_one_span_with_a_child_span_per_lane(tmp_path: Path) -> None:
    async with _traced_and_indexed(tmp_path) as (exporter, kc):
        answer = await kc.search(
            f"{WORD} decoder",
            include=["episodes", "code"],
            request_id="trace-req-1",
        )
    spans = exporter.get_finished_spans()
    rpc = [s for s in spans if s.name == "knowledge.v1.KnowledgeService/Search"]
    assert len(rpc) == 1
    root = rpc[0]
    assert root.attributes is not None
    assert root.attributes["knowledge.request_id"] == "trace-req-1"
    assert root.attributes["rpc.grpc.status_code"] == "OK"
    assert root.attributes["knowledge.search.items"] == answer.limits.returned
    lanes = {s.name: s for s in spans if s.parent is not None}
    assert set(lanes) == {"lane episodes", "lane code"}
    for span in lanes.values():
        assert span.parent is not None and root.context is not None
        assert span.parent.span_id == root.context.span_id
        assert span.context is not None and span.context.trace_id == root.context.trace_id
        assert span.start_time is not None and root.start_time is not None
        assert span.start_time >= root.start_time
    assert lanes["lane code"].attributes is not None
    assert lanes["lane code"].attributes["knowledge.lane.items"] > 0
    text = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
    assert WORD not in text and "decoder" not in text


async def test_a_dispatch_span_has_the_lane_spans_of_its_search(tmp_path: Path) -> None:
    """A dispatch searches to plan: its lanes are child spans of the Dispatch span (they
    were dropped with the metrics, so a slow dispatch showed no lane), and the Dispatch
    span carries no search answer's attributes (it returns none)."""
    async with _traced_and_indexed(tmp_path) as (exporter, kc):
        await kc.dispatch(f"fix the {WORD} decoder")
    spans = exporter.get_finished_spans()
    rpc = [s for s in spans if s.name == "knowledge.v1.KnowledgeService/Dispatch"]
    assert len(rpc) == 1
    root = rpc[0]
    assert root.context is not None and root.attributes is not None
    assert not any(k.startswith("knowledge.search.") for k in root.attributes)
    lanes = [s for s in spans if s.name.startswith("lane ")]
    assert {s.name for s in lanes} >= {"lane episodes", "lane code"}
    for span in lanes:
        assert span.parent is not None and span.parent.span_id == root.context.span_id
    text = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
    assert WORD not in text and "decoder" not in text


@contextmanager
def _call_logs() -> Iterator[list[dict[str, Any]]]:
    """Log entries with the call's context (request id, method) merged in, as the
    configured renderers get them."""
    capture = LogCapture()
    old = structlog.get_config()["processors"]
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture])
    try:
        yield capture.entries
    finally:
        structlog.configure(processors=old)


async def test_the_log_line_of_a_search_carries_its_body_request_id(tmp_path: Path) -> None:
    rs = await start_server(tmp_path)
    try:
        with _call_logs() as logs:
            async with AsyncKnowledgeClient(rs.address) as kc:
                # No ingest, no index: a partial answer (lanes not ready).
                answer = await kc.search(f"where is {CANARY} handled", request_id="grpcurl-42")
    finally:
        await shutdown(rs.served, 0)
    assert answer.warnings
    lines = [e for e in logs if e.get("event") == "rpc.ok" and e.get("rpc_method") == SEARCH]
    assert len(lines) == 1
    line = lines[0]
    assert line["request_id"] == "grpcurl-42"
    assert line["log_level"] == "warning" and line["partial"] is True
    assert "KNOWLEDGE_INDEX_NOT_READY:episodes" in line["warnings"]
    assert line["degraded"]["episodes"] == "KNOWLEDGE_INDEX_NOT_READY"
    assert CANARY not in json.dumps(logs, default=str)


async def test_a_refused_call_sends_its_request_id_back(tmp_path: Path) -> None:
    rs = await start_server(tmp_path)
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            try:
                await kc.themes()
            except EditionRefused as err:
                refused = err
            else:
                raise AssertionError("Community answered a doc-graph call")
    finally:
        await shutdown(rs.served, 0)
    assert refused.request_id


async def test_an_answer_with_warnings_only_is_not_logged_as_partial(tmp_path: Path) -> None:
    """A search trimmed to its budget (a warning, no error, no degraded lane) logs its
    codes at info level: a warning line per trimmed answer would be noise."""
    ws, logs = _workspace(tmp_path, files=30)
    rs = await start_server(tmp_path, workspaces=[str(ws)], session_paths=[str(logs)])
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            async for _ in kc.index_workspace(str(ws)):
                pass
            async for _ in kc.ingest_sessions([str(logs)]):
                pass
            with _call_logs() as entries:
                answer = await kc.search(
                    f"{WORD} decode frames", include=["code"], limit=50, max_tokens=500
                )
    finally:
        await shutdown(rs.served, 0)
    assert answer.limits.truncated and not answer.errors
    assert not any(getattr(answer.lanes, n).degraded for n in ("code", "episodes"))
    [line] = [e for e in entries if e.get("event") == "rpc.ok"]
    assert line["log_level"] == "info" and "partial" not in line
    assert "KNOWLEDGE_BUDGET_EXCEEDED" in line["warnings"]


async def test_a_sample_ratio_of_zero_traces_no_call_and_configuration_checks_it(
    tmp_path: Path,
) -> None:
    """tracing_sample_ratio: an untraced call has no span, and neither have its lanes."""
    with pytest.raises(ConfigError, match="tracing_sample_ratio"):
        load_config(env={}, overrides={"tracing_sample_ratio": 1.5})
    spans: dict[float, int] = {}
    for ratio in (0.0, 1.0):
        exporter = InMemorySpanExporter()
        provider = provider_with(exporter, ratio)
        cfg = load_config(
            env={},
            overrides={
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp_path / f"d{ratio}"),
                "bootstrap": False,
            },
        )
        served = await create_server(cfg, build_app(cfg), tracing=Tracing(provider))
        await served.server.start()
        try:
            async with AsyncKnowledgeClient(f"127.0.0.1:{served.port}") as kc:
                for i in range(5):
                    await kc.search(f"{WORD} question {i}", include=["episodes", "code"])
        finally:
            await shutdown(served, 0)  # flushes the batch of spans
        spans[ratio] = len(exporter.get_finished_spans())
    assert spans == {0.0: 0, 1.0: 15}  # five calls, each with two lanes


class _EveryOtherCall(Sampler):
    """Samples the first call, not the second, and so on (a ratio of 0.5, deterministic)."""

    def __init__(self) -> None:
        self.calls = 0

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        self.calls += 1
        if self.calls % 2:
            # A sampler hands the span its attributes (as the SDK's own samplers do).
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        return "every other call"


async def test_a_traced_call_has_all_its_lane_spans_and_an_untraced_call_none(
    tmp_path: Path,
) -> None:
    """Traced and untraced calls interleaved: an untraced call leaves no span current
    behind it, so each lane span has the RPC span of its own call as parent, and every
    traced search has its two lanes."""
    exporter, tracing = _recorded(ParentBased(_EveryOtherCall()))
    cfg = load_config(
        env={},
        overrides={"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "d"), "bootstrap": False},
    )
    served = await create_server(cfg, build_app(cfg), tracing=tracing)
    await served.server.start()
    try:
        async with AsyncKnowledgeClient(f"127.0.0.1:{served.port}") as kc:
            for i in range(6):
                await kc.search(
                    f"{WORD} question {i}", include=["episodes", "code"], request_id=f"r{i}"
                )
    finally:
        await shutdown(served, 0)
    spans = exporter.get_finished_spans()
    rpcs = {s.context.span_id: s for s in spans if s.parent is None and s.context is not None}
    assert sorted((s.attributes or {})["knowledge.request_id"] for s in rpcs.values()) == [
        "r0",
        "r2",
        "r4",
    ]
    lanes = [s for s in spans if s.parent is not None]
    assert len(lanes) == 6
    for lane in lanes:
        assert lane.parent is not None and lane.parent.span_id in rpcs
        parent = rpcs[lane.parent.span_id]
        assert lane.context is not None and parent.context is not None
        assert lane.context.trace_id == parent.context.trace_id
    by_call = sorted(rpcs[s.parent.span_id].attributes["knowledge.request_id"] for s in lanes)  # type: ignore[union-attr,index]
    assert by_call == ["r0", "r0", "r2", "r2", "r4", "r4"]


async def test_a_call_to_the_http_face_is_one_server_span(tmp_path: Path) -> None:
    """A Retrieve through the HTTP face is one server span named by its path, with the
    call's trace id and HTTP status; an invalid call (400) is a span too, not an error
    (the caller's fault); no value of the body appears in any span."""
    exporter, tracing = _recorded()
    cfg = load_config(
        env={},
        overrides={
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp_path / "data"),
            "bootstrap": False,
            "retrieve_http_listen": "127.0.0.1:0",
        },
    )
    served = await create_server(cfg, build_app(cfg), tracing=tracing)
    await start_served(served)
    try:
        assert served.http is not None
        url = f"http://127.0.0.1:{served.http.port}/knowledge/retrieve"
        async with httpx.AsyncClient(timeout=30) as http:
            ok = await http.post(
                url, json={"query": f"{WORD} refund"}, headers={"X-Trace-Id": "http-trace-1"}
            )
            assert ok.status_code == 200, ok.text
            wrong = await http.post(url, content=b"{", headers={"Content-Type": "text/plain"})
            assert wrong.status_code == 400
    finally:
        await shutdown(served, 0)
    spans = [s for s in exporter.get_finished_spans() if s.name == "POST /knowledge/retrieve"]
    assert len(spans) == 2
    first, second = spans
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["knowledge.request_id"] == "http-trace-1"
    assert first.attributes["http.response.status_code"] == 200
    assert second.attributes["http.response.status_code"] == 400
    assert first.status.is_ok and second.status.is_ok  # 4xx: not the server's error
    text = json.dumps([dict(s.attributes or {}) for s in exporter.get_finished_spans()])
    assert WORD not in text and "refund" not in text


@pytest.mark.parametrize(
    ("left", "code"),
    [
        (None, "CANCELLED"),
        (2.0, "CANCELLED"),
        (0.2, "CANCELLED"),
        (0.03, "DEADLINE_EXCEEDED"),
        (-0.5, "DEADLINE_EXCEEDED"),
    ],
)
def test_a_call_cut_off_is_a_deadline_only_at_its_deadline(left: float | None, code: str) -> None:
    """A call gRPC cut off without a code is DEADLINE_EXCEEDED when its deadline had passed
    or was a few milliseconds away (the caller's timer fires first), else CANCELLED: a
    caller's own cancel 0.2 s before its deadline was counted as a deadline (the margin was
    a quarter of a second). The time left is the call context's, as gRPC reports it."""
    from knowledge_server.transport.interceptors import _Observed

    class Context:
        def time_remaining(self) -> float | None:
            return left

    observed = _Observed.__new__(_Observed)
    observed.context = Context()  # type: ignore[assignment]
    assert observed.cut_off() == code
