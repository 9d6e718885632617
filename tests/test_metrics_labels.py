"""Metric labels hold codes from fixed sets, never a message; an operator stream the
caller left (its work goes on and commits) is no failed run."""

from __future__ import annotations

from knowledge_server._gen.knowledge.v1 import index_service_pb2
from knowledge_server.metrics import Metrics, reason_code


def test_a_degradation_reason_becomes_its_code_or_other() -> None:
    assert (
        reason_code("KNOWLEDGE_LANE_TIMEOUT: no answer within 250 ms") == "KNOWLEDGE_LANE_TIMEOUT"
    )
    assert reason_code("KNOWLEDGE_LANE_DEGRADED") == "KNOWLEDGE_LANE_DEGRADED"
    # A lane's plain sentence (with server-written details) is no code.
    assert reason_code("embedding provider unavailable (embedding endpoint unreachable") == "other"
    assert reason_code("no embedder configured; lexical only") == "other"
    assert reason_code("") == "unknown"


def _runs(metrics: Metrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "knowledge_operation_runs_total", {"operation": "index", "outcome": outcome}
    )
    return value or 0.0


def test_a_stream_the_caller_left_is_counted_cancelled_not_failed() -> None:
    metrics = Metrics()
    method = "/knowledge.v1.IndexService/IndexWorkspace"
    metrics.operation(method, None, 1.0, ended="CANCELLED")
    metrics.operation(method, None, 1.0, ended="DEADLINE_EXCEEDED")
    metrics.operation(method, None, 1.0, ended="INTERNAL")
    metrics.operation(method, None, 1.0)
    metrics.operation(method, index_service_pb2.OperationSummary(index_rev="r1"), 1.0)
    outcomes = ("cancelled", "deadline_exceeded", "failed", "ok")
    assert [_runs(metrics, o) for o in outcomes] == [1.0, 1.0, 2.0, 1.0]
