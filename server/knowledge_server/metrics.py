"""Prometheus metrics (``prometheus_client``), served on ``metrics_listen`` when it is set.

Off by default. Each serving process has its own registry and, when on, its own
endpoint (with ``workers > 1`` the extra processes are not scraped: see
docs/configuration.md). What is exported, all counts and timings, never text:

- per RPC and gRPC status code: calls and latency;
- per search lane: latency, timeouts, degradations by reason code, answers and answers
  with no items (the zero-result rate is their ratio), lane cache hits;
- per search answer: answers, answers with both code and episode evidence, answers the
  budget truncated, answers served whole from the cache;
- per operator stream (index, ingest, rebuild, build): runs by outcome, the summary's
  counters (files, chunks, events ...), seconds spent and the last success time;
- the licence: edition and state, days to expiry; edition refusals per feature.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from knowledge_server.config import ConfigError, parse_listen
from knowledge_server.search.lanes import EMPTY_REASONS, why_empty

# Search calls take milliseconds; operator streams take seconds to minutes.
_RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60)
_LANE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)

# Operator streams by full method name, and the operation each one is.
OPERATIONS = {
    "/knowledge.v1.IndexService/IndexWorkspace": "index",
    "/knowledge.v1.IndexService/IngestSessions": "ingest",
    "/knowledge.v1.IndexService/RebuildDerived": "rebuild",
    "/knowledge.v1.IndexService/BuildDocGraph": "build_doc_graph",
}


# The outcome of an operator stream its caller left, by the code the caller got.
_LEFT = {"CANCELLED": "cancelled", "DEADLINE_EXCEEDED": "deadline_exceeded"}

_CODE = re.compile(r"[A-Z][A-Z0-9_]{2,63}")


def reason_code(text: str) -> str:
    """The reason code of a lane's ``degradation_reason`` ("CODE" or "CODE: message"):
    labels and attributes carry the code alone, never a message; a reason that does not
    start with a code (a lane's plain sentence) is "other"."""
    head = text.split(":", 1)[0].strip()
    if not head:
        return "unknown"
    return head if _CODE.fullmatch(head) else "other"


class _LicenceCollector(Collector):
    """Edition, licence state and days to expiry, read from the licence at scrape time
    (a reloaded licence shows at the next scrape)."""

    def __init__(self, status: Callable[[], Any]) -> None:
        self._status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        st = self._status()
        state = GaugeMetricFamily(
            "knowledge_licence_info",
            "The running edition and licence state (value 1).",
            labels=["edition", "licence_state"],
        )
        state.add_metric([st.edition, st.licence_state], 1.0)
        yield state
        if st.HasField("expires_at"):
            days = (st.expires_at.seconds - time.time()) / 86400
            yield GaugeMetricFamily(
                "knowledge_licence_days_to_expiry",
                "Days until the licence expires (negative once expired).",
                value=round(days, 3),
            )


def _count_call(
    children: dict[tuple[str, str], tuple[Counter, Histogram]],
    calls: Counter,
    latency: Histogram,
    labels: tuple[str, str],
    seconds: float,
) -> None:
    """One call counted and timed under ``labels``, through label children looked up
    once (``children``)."""
    held = children.get(labels)
    if held is None:
        held = children[labels] = (calls.labels(*labels), latency.labels(*labels))
    held[0].inc()
    held[1].observe(seconds)


class Metrics:
    """The service's metrics in one registry of its own (so several servers in one
    process, as in tests, do not share counters)."""

    # A dispatch's search is no lane search a Search caller got: not counted.
    inner_lanes = False

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.rpc_calls = Counter(
            "knowledge_rpc_calls",
            "Calls by full method name and gRPC status code.",
            ["method", "code"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "knowledge_rpc_duration_seconds",
            "Call latency by method and status code (streams: until the last message).",
            ["method", "code"],
            buckets=_RPC_BUCKETS,
            registry=r,
        )
        self.http_calls = Counter(
            "knowledge_http_requests",
            "Requests to the HTTP face (retrieve_http_listen) by path and HTTP status.",
            ["path", "status"],
            registry=r,
        )
        self.http_seconds = Histogram(
            "knowledge_http_request_duration_seconds",
            "HTTP face latency by path and HTTP status.",
            ["path", "status"],
            buckets=_RPC_BUCKETS,
            registry=r,
        )
        self.lane_seconds = Histogram(
            "knowledge_lane_duration_seconds",
            "A search lane's own time per search.",
            ["lane"],
            buckets=_LANE_BUCKETS,
            registry=r,
        )
        self.lane_answers = Counter(
            "knowledge_lane_answers", "Searches a lane took part in.", ["lane"], registry=r
        )
        self.lane_zero = Counter(
            "knowledge_lane_zero_results",
            "Searches in which a lane had no item, by why (zero-result rate: this / answers).",
            ["lane", "reason"],
            registry=r,
        )
        self.lane_timeouts = Counter(
            "knowledge_lane_timeouts",
            "Lane calls cut off at lane_timeout_ms.",
            ["lane"],
            registry=r,
        )
        self.lane_degradations = Counter(
            "knowledge_lane_degradations",
            "Degraded lane answers by reason code.",
            ["lane", "reason"],
            registry=r,
        )
        self.lane_cache_hits = Counter(
            "knowledge_lane_cache_hits",
            "Lane answers served from the result cache (hit ratio: this / answers).",
            ["lane"],
            registry=r,
        )
        self.search_answers = Counter(
            "knowledge_search_answers", "Search answers returned.", registry=r
        )
        self.search_both = Counter(
            "knowledge_search_answers_with_code_and_episodes",
            "Search answers holding both code and episode evidence.",
            registry=r,
        )
        self.search_truncated = Counter(
            "knowledge_search_budget_truncations",
            "Search answers the max_tokens budget cut down.",
            registry=r,
        )
        self.search_cache_hits = Counter(
            "knowledge_search_cache_hits",
            "Search answers served whole from the answer cache (hit ratio: this / answers).",
            registry=r,
        )
        self.operation_runs = Counter(
            "knowledge_operation_runs",
            "Operator streams (index, ingest, rebuild, build_doc_graph) by outcome.",
            ["operation", "outcome"],
            registry=r,
        )
        self.operation_items = Counter(
            "knowledge_operation_items",
            "The counters of operation summaries (files, chunks, events, ...).",
            ["operation", "counter"],
            registry=r,
        )
        self.operation_seconds = Counter(
            "knowledge_operation_seconds",
            "Seconds spent in operations (throughput: rate(items) / rate(seconds)).",
            ["operation"],
            registry=r,
        )
        self.operation_last_success = Gauge(
            "knowledge_operation_last_success_timestamp_seconds",
            "When an operation last completed (Unix time).",
            ["operation"],
            registry=r,
        )
        self.edition_refusals = Counter(
            "knowledge_edition_refusals",
            "Calls refused because the edition lacks their feature.",
            ["feature", "method"],
            registry=r,
        )
        self._licence: _LicenceCollector | None = None
        # The label children of a search's metrics, looked up once per method and code and
        # once per lane: a ``labels()`` lookup takes a lock and validates its values.
        self._rpc_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._http_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._lane_children: dict[str, tuple[Counter, Histogram, Counter]] = {}

    def watch_licence(self, status: Callable[[], Any]) -> None:
        """Export the licence read through ``status()`` (an ``EditionStatus``)."""
        if self._licence is None:
            self._licence = _LicenceCollector(status)
            self.registry.register(self._licence)

    # Calls

    def rpc(self, method: str, code: str, seconds: float) -> None:
        _count_call(self._rpc_children, self.rpc_calls, self.rpc_seconds, (method, code), seconds)

    def http(self, path: str, status: int, seconds: float) -> None:
        """A request the HTTP face answered; ``path`` is one it serves, or "other"
        (any other path is one label, so a scan cannot grow the label set)."""
        _count_call(
            self._http_children, self.http_calls, self.http_seconds, (path, str(status)), seconds
        )

    def refused_edition(self, feature: str, method: str) -> None:
        self.edition_refusals.labels(feature, method).inc()

    def operation(
        self, method: str, summary: Any | None, seconds: float, *, ended: str | None = None
    ) -> None:
        """An operator stream ended: ``summary`` is its ``OperationSummary``, None when it
        ended before one with the gRPC code ``ended``. A stream its caller left
        (``CANCELLED``, or ``DEADLINE_EXCEEDED`` when the caller's deadline passed) is no
        failed run: its work goes on and commits."""
        op = OPERATIONS.get(method)
        if op is None:
            return
        if summary is None:
            self.operation_runs.labels(op, _LEFT.get(ended or "", "failed")).inc()
            return
        self.operation_runs.labels(op, "problems" if summary.problems else "ok").inc()
        for key, value in summary.counters.items():
            if value > 0:
                self.operation_items.labels(op, key).inc(value)
        self.operation_seconds.labels(op).inc(summary.ms / 1000 if summary.ms else seconds)
        self.operation_last_success.labels(op).set(time.time())

    # Search (the coordinator's observer)

    def lane(self, name: str, start_ns: int, end_ns: int, ms: float, result: Any) -> None:
        lane = result.lane
        children = self._lane_children.get(name)
        if children is None:
            children = (
                self.lane_answers.labels(name),
                self.lane_seconds.labels(name),
                self.lane_cache_hits.labels(name),
            )
            self._lane_children[name] = children
        answers, latency, cache_hits = children
        answers.inc()
        latency.observe(ms / 1000)
        if not lane.items:
            # The reasons are the lanes' own constants (EMPTY_REASONS): a bounded label set.
            reason = why_empty(lane)
            self.lane_zero.labels(name, reason if reason in EMPTY_REASONS else "other").inc()
        if result.cache_hit:
            cache_hits.inc()
        if lane.degraded:
            reason = reason_code(lane.degradation_reason)
            self.lane_degradations.labels(name, reason).inc()
            if reason == "KNOWLEDGE_LANE_TIMEOUT":
                self.lane_timeouts.labels(name).inc()

    def answer(self, resp: Any, *, cache_hit: bool) -> None:
        self.search_answers.inc()
        if resp.lanes.code.items and resp.lanes.episodes.items:
            self.search_both.inc()
        if resp.limits.truncated:
            self.search_truncated.inc()
        if cache_hit:
            self.search_cache_hits.inc()


class MetricsEndpoint:
    """The HTTP endpoint (``/metrics``) on its own thread, on ``listen`` (``HOST:PORT``,
    validated by the configuration; port 0 picks a free port); ``port`` is the bound port."""

    def __init__(self, metrics: Metrics, listen: str) -> None:
        host, port = parse_listen(listen)
        host = host.strip("[]")
        try:
            self._server, self._thread = start_http_server(
                port, addr=host, registry=metrics.registry
            )
        except OSError as exc:
            raise ConfigError(f"metrics_listen: cannot listen on {listen}: {exc}") from None
        self.host = host
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if isinstance(self._thread, threading.Thread):
            self._thread.join(5)
