"""OpenTelemetry tracing: one span per RPC, a child span per search lane.

Off by default; ``tracing_otlp_endpoint`` turns it on and exports OTLP over gRPC there.
Spans carry ids, codes, counts and timings only, never query text, snippets or
tokens: the RPC span has the method, the request id, the principal id and the status
code; a lane span has the lane, its item count, whether it came from the cache, and
its degradation reason.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from knowledge_server.metrics import reason_code

SERVICE_NAME = "knowledge-service"


def otlp_provider(endpoint: str) -> TracerProvider:
    """A provider exporting in batches to the OTLP/gRPC collector at ``endpoint``."""
    insecure = endpoint.startswith("http://")
    return provider_with(OTLPSpanExporter(endpoint=endpoint, insecure=insecure))


def provider_with(exporter: SpanExporter) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class Tracing:
    """Spans of one server, from its own provider (never the process-global one)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("knowledge_server")

    def start_rpc(self, method: str, request_id: str) -> tuple[Span, object]:
        """The RPC's span, made current for the call's task (lane spans nest under it);
        returns it and the token to detach it with."""
        span = self._tracer.start_span(
            method.lstrip("/"),
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.method": method,
                "knowledge.request_id": request_id,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        return span, token

    def start_stream(self, method: str, request_id: str) -> Span:
        """A streaming RPC's span (not made current: a generator may resume elsewhere)."""
        return self._tracer.start_span(
            method.lstrip("/"),
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.method": method,
                "knowledge.request_id": request_id,
            },
        )

    @staticmethod
    def end_rpc(
        span: Span, token: object | None, code: str, attributes: dict[str, Any] | None = None
    ) -> None:
        span.set_attribute("rpc.grpc.status_code", code)
        for key, value in (attributes or {}).items():
            span.set_attribute(key, value)
        if code not in ("OK", "CANCELLED", "DEADLINE_EXCEEDED"):
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]

    # The search coordinator's observer

    def lane(self, name: str, start_ns: int, end_ns: int, ms: float, result: Any) -> None:
        lane = result.lane
        span = self._tracer.start_span(
            f"lane {name}",
            start_time=start_ns,
            attributes={
                "knowledge.lane": name,
                "knowledge.lane.items": len(lane.items),
                "knowledge.lane.cache_hit": bool(result.cache_hit),
                "knowledge.lane.degraded": bool(lane.degraded),
                "knowledge.lane.degradation_reason": (
                    reason_code(lane.degradation_reason) if lane.degraded else ""
                ),
                "knowledge.lane.ms": round(ms, 3),
            },
        )
        span.end(end_time=end_ns)

    def answer(self, resp: Any, *, cache_hit: bool) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        span.set_attribute("knowledge.search.items", int(resp.limits.returned))
        span.set_attribute("knowledge.search.found", bool(resp.found))
        span.set_attribute("knowledge.search.cache_hit", cache_hit)
        span.set_attribute("knowledge.search.truncated", bool(resp.limits.truncated))
        span.set_attribute("knowledge.search.warnings", [n.code for n in resp.warnings])

    def shutdown(self) -> None:
        self.provider.shutdown()
