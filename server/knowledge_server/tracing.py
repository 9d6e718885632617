"""OpenTelemetry tracing: one span per RPC, a child span per search lane.

Off by default; ``tracing_otlp_endpoint`` turns it on and exports OTLP over gRPC there,
for the share ``tracing_sample_ratio`` of the calls (a tenth by default).
Spans carry ids, codes, counts and timings only, never query text, snippets or
tokens: the RPC span is named after the method and has the request id and the status
code (a search's also its item count, cache hit, truncation and warning codes); a lane
span is named after the lane and has its item count, whether it came from the cache,
and its degradation reason.

The cost is in the spans that are recorded: making them on the call's path, encoding and
sending them on the batch processor's thread. A call not sampled makes one non-recording
span and nothing else: no attributes are validated, nothing is made current, its lanes
make no span. Hence few attributes, each set once.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from knowledge_server.metrics import reason_code

SERVICE_NAME = "knowledge-service"


def otlp_provider(endpoint: str, ratio: float) -> TracerProvider:
    """A provider exporting in batches to the OTLP/gRPC collector at ``endpoint``,
    tracing the share ``ratio`` of the calls."""
    insecure = endpoint.startswith("http://")
    return provider_with(OTLPSpanExporter(endpoint=endpoint, insecure=insecure), ratio)


def provider_with(exporter: SpanExporter, ratio: float = 1.0) -> TracerProvider:
    """A provider exporting to ``exporter`` in batches. A call is traced with probability
    ``ratio`` (by its trace id); its lane spans follow their parent."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": SERVICE_NAME}),
        sampler=ParentBased(TraceIdRatioBased(ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _rpc_attributes(request_id: str) -> dict[str, Any]:
    # The method is the span's name; an attribute for it too would be encoded again.
    return {"rpc.system": "grpc", "knowledge.request_id": request_id}


class Tracing:
    """Spans of one server, from its own provider (never the process-global one)."""

    # A dispatch's search: its lanes are child spans of the Dispatch span.
    inner_lanes = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("knowledge_server")

    def start_rpc(self, method: str, request_id: str) -> tuple[Span, object | None]:
        """The RPC's span, made current for the call's task (lane spans nest under it);
        returns it and the token to detach it with (None for a call not traced: nothing
        is made current, so its lanes make no span either)."""
        return self._start_current(method.lstrip("/"), _rpc_attributes(request_id))

    def _start_current(self, name: str, attributes: dict[str, Any]) -> tuple[Span, object | None]:
        """A server span made current (when recorded) and its detach token."""
        span = self._tracer.start_span(name, kind=SpanKind.SERVER, attributes=attributes)
        if not span.is_recording():
            return span, None
        return span, otel_context.attach(trace.set_span_in_context(span))

    def start_stream(self, method: str, request_id: str) -> Span:
        """A streaming RPC's span (not made current: a generator may resume elsewhere)."""
        return self._tracer.start_span(
            method.lstrip("/"), kind=SpanKind.SERVER, attributes=_rpc_attributes(request_id)
        )

    def start_http(self, path: str, request_id: str) -> tuple[Span, object | None]:
        """A call to the HTTP face: its span, made current as an RPC's is."""
        attributes = {
            "http.request.method": "POST",
            "url.path": path,
            "knowledge.request_id": request_id,
        }
        return self._start_current(f"POST {path}", attributes)

    @staticmethod
    def end_http(span: Span, token: object | None, status: int) -> None:
        # A server span's error is the server's fault (5xx), not the caller's.
        error = str(status) if status >= 500 else None
        Tracing._end(span, token, {"http.response.status_code": status}, error)

    @staticmethod
    def end_rpc(
        span: Span, token: object | None, code: str, attributes: dict[str, Any] | None = None
    ) -> None:
        error = code if code not in ("OK", "CANCELLED", "DEADLINE_EXCEEDED") else None
        Tracing._end(span, token, {"rpc.grpc.status_code": code, **(attributes or {})}, error)

    @staticmethod
    def _end(
        span: Span, token: object | None, attributes: dict[str, Any], error: str | None
    ) -> None:
        """Detach the span (``token``), then, when recorded, set its attributes and its
        error status (``error`` not None) and end it."""
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
        if not span.is_recording():
            return
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    # The search coordinator's observer

    def lane(self, name: str, start_ns: int, end_ns: int, ms: float, result: Any) -> None:
        # A call not traced has no current span: its lanes cost this check alone.
        if not trace.get_current_span().is_recording():
            return
        lane = result.lane
        attributes: dict[str, Any] = {
            "knowledge.lane.items": len(lane.items),
            "knowledge.lane.cache_hit": bool(result.cache_hit),
        }
        if lane.degraded:
            attributes["knowledge.lane.degradation_reason"] = reason_code(lane.degradation_reason)
        span = self._tracer.start_span(f"lane {name}", start_time=start_ns, attributes=attributes)
        span.end(end_time=end_ns)

    def answer(self, resp: Any, *, cache_hit: bool) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        attributes: dict[str, Any] = {
            "knowledge.search.items": int(resp.limits.returned),
            "knowledge.search.found": bool(resp.found),
            "knowledge.search.cache_hit": cache_hit,
            "knowledge.search.truncated": bool(resp.limits.truncated),
        }
        if resp.warnings:
            attributes["knowledge.search.warnings"] = [n.code for n in resp.warnings]
        span.set_attributes(attributes)

    def shutdown(self) -> None:
        self.provider.shutdown()
