"""OpenTelemetry spans (`ORRERY_TRACING=true`): one per HTTP request, one per query stage.

A request's span continues the caller's W3C `traceparent` when it sends one; its trace id
is the request's (`contracts.request_context`: log lines, `query_plan.trace_id`). Query
stage spans are children of the request span, laid end to end from the stopwatch the
query already keeps (`query_plan.latency_ms`): their durations are the plan's, so they
sum to the query's time without a clock read per stage.

Spans are exported over OTLP/HTTP when `ORRERY_OTLP_ENDPOINT` is set (the optional
`otlp` extra: `pip install 'orrery[otlp]'`); tests pass an in-memory exporter. Without
either no span is made at all (a span costs ~100 us of the request's thread, for
nothing when nobody receives it): each request still gets its W3C ids — the caller's
trace id continued, a new span id — so log lines, `query_plan.trace_id` and the
`traceparent` a write carries through the outbox and Kafka are the same as with spans.

Spans are sampled at the head (`ORRERY_TRACING_SAMPLE_RATIO`, the SDK's
`ParentBased(TraceIdRatioBased(ratio))`): a request continuing a caller's trace follows
the caller's sampled flag; any other request, and each projector batch, is sampled with
probability `ratio` by its trace id. An unsampled request makes no span at all (neither
its own nor its stages') but keeps its W3C ids, as above; its `traceparent` says
"not sampled" (flags `00`), so the services it calls and the writes it carries do not
sample it either.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Scope

from contracts.request_context import RequestContext
from query.ports import Answered

__all__ = ["Tracing", "head_sampler", "open_tracing"]

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})
_TRACEPARENT = re.compile(rb"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-([0-9a-f]{2})")
_NO_TRACE = b"0" * 32
# The answers a traced request made, for `Tracing.end_request` (set per request).
_ANSWERS: ContextVar[list[tuple[int, Answered]] | None] = ContextVar(
    "orrery_trace_answers", default=None
)


class Tracing:
    """Spans of one process, from its own `TracerProvider` (never the global one: tests
    open several stacks in one interpreter). `exporting` False: ids only, no spans (see
    the module docstring); then `wrap_projector_step` and `answered` are not used."""

    def __init__(self, provider: TracerProvider, *, exporting: bool = True) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("orrery")
        self.exporting = exporting

    # --- HTTP requests ---------------------------------------------------------------

    def start_request(self, scope: Scope, context: RequestContext) -> Any:
        """The request's span (None: not exporting, or not sampled), current until
        `end_request`; sets the request's `trace_id` and `traceparent` either way."""
        if not self.exporting:
            _ids_only(scope, context)
            return None
        carrier = {
            name.decode(): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in _TRACE_HEADERS
        }
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            scope["method"],
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": scope["method"]},
        )
        own = span.get_span_context()
        context.trace_id = format(own.trace_id, "032x")
        context.traceparent = f"00-{context.trace_id}-{own.span_id:016x}-{own.trace_flags:02x}"
        if not span.is_recording():
            # Not sampled: the ids are kept, nothing else is made (no stage spans either:
            # `answered` finds neither a pending list nor a current span).
            return None
        token = otel_context.attach(trace.set_span_in_context(span))
        answers: list[tuple[int, Answered]] = []
        return span, token, answers, _ANSWERS.set(answers)

    def end_request(self, handle: Any, route: str, status: int, context: RequestContext) -> None:
        """End the request's span, after making the stage spans of the answers it made
        (`answered`): this runs once the response has left, so the spans' cost is not
        part of the answer's latency."""
        if handle is None:
            return
        span, token, answers, answers_token = handle
        otel_context.detach(token)
        _ANSWERS.reset(answers_token)
        if answers:
            parent = trace.set_span_in_context(span)
            for end, answer in answers:
                self._stage_spans(answer, end, parent)
        span.update_name(f"{span.name} {route}")
        span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        span.set_attribute("orrery.request_id", context.request_id)
        if context.error_code is not None:
            span.set_attribute("orrery.error_code", context.error_code)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, context.error_code or str(status)))
        span.end()

    # --- queries (query.ports.QueryObserver) -----------------------------------------

    def answered(self, answer: Answered) -> None:
        """One child span per stage of the answer just made, under the request's span,
        ending now and laid end to end by the stopwatch's durations. Inside a request
        they are made by `end_request`, after the response has left; outside one, under
        the current span (none: no spans)."""
        pending = _ANSWERS.get()
        if pending is not None:
            pending.append((time.time_ns(), answer))
        elif trace.get_current_span().get_span_context().is_valid:
            self._stage_spans(answer, time.time_ns(), None)

    def _stage_spans(self, answer: Answered, end: int, parent: Any) -> None:
        endpoint, stages_ms, engine_ms, cache, _ = answer
        at = end - int(sum(stages_ms.values()) * 1e6)
        for stage, ms in stages_ms.items():
            span = self.tracer.start_span(
                f"query.{stage}",
                context=parent,
                start_time=at,
                attributes={"orrery.endpoint": endpoint, "orrery.stage": stage},
            )
            at += int(ms * 1e6)
            if stage == "rerank" or stage == "index_search":
                for call, call_ms in engine_ms.items():
                    span.set_attribute(f"orrery.engine_ms.{call}", call_ms)
            if stage == "scope_resolve":
                span.set_attribute("orrery.cache", cache)
            span.end(end_time=at)

    # --- the projector -------------------------------------------------------------

    def wrap_projector_step(self, step: Callable[[], Any]) -> Callable[[], Any]:
        """`step` (a projector batch returning a `BatchReport`) with a `projector.batch`
        span for each batch that applied events, linked to the spans of the writes it
        applied (their trace contexts came along through the outbox row, and in server
        mode the Kafka headers). A failed batch gets an error span."""

        def traced() -> Any:
            started = time.time_ns()
            try:
                report = step()
            except Exception as exc:
                span = self.tracer.start_span("projector.batch", start_time=started)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                span.end()
                raise
            if report.events:
                links = [Link(c) for c in map(_span_context, report.trace_contexts) if c]
                span = self.tracer.start_span(
                    "projector.batch",
                    start_time=started,
                    links=links,
                    attributes={
                        "orrery.events": report.events,
                        "orrery.position": report.position,
                        "orrery.embedded": report.embedded,
                    },
                )
                span.end()
            return report

        return traced

    def close(self) -> None:
        self.provider.shutdown()


def _ids_only(scope: Scope, context: RequestContext) -> None:
    """A request's W3C ids without a span: the caller's trace id when its `traceparent`
    is well formed, else a new one, and a new span id."""
    trace_id = flags = None
    for name, value in scope["headers"]:
        if name == b"traceparent":
            match = _TRACEPARENT.fullmatch(value)
            if match is not None and match[1] != _NO_TRACE:
                trace_id, flags = match[1].decode(), match[2].decode()
            break
    if trace_id is None:
        trace_id, flags = os.urandom(16).hex(), "01"
    context.trace_id = trace_id
    context.traceparent = f"00-{trace_id}-{os.urandom(8).hex()}-{flags}"


def _span_context(traceparent: str) -> SpanContext | None:
    """The remote span a W3C `traceparent` names, or None for a malformed one."""
    carried = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent}))
    context = carried.get_span_context()
    return context if context.is_valid else None


def head_sampler(ratio: float) -> Sampler:
    """The SDK's `ParentBased(TraceIdRatioBased(ratio))`: a span with a parent is sampled
    as its parent was (a caller's `traceparent` flag), a root span with probability
    `ratio` by its trace id. `ValueError` outside [0, 1]."""
    if not 0.0 <= ratio <= 1.0:  # also refuses NaN
        raise ValueError(f"the trace sample ratio must be in [0, 1], not {ratio!r}")
    return ParentBased(TraceIdRatioBased(ratio))


def open_tracing(
    otlp_endpoint: str | None,
    *,
    service: str,
    roles: Iterable[str],
    exporter: SpanExporter | None = None,
    sample_ratio: float = 1.0,
) -> Tracing:
    """A `Tracing` whose spans go to `exporter` (synchronously: tests), else to the OTLP
    endpoint (batched), else one that makes no spans (`exporting` False). Spans are
    sampled by `head_sampler(sample_ratio)`."""
    resource = Resource.create({"service.name": service, "orrery.roles": ",".join(sorted(roles))})
    provider = TracerProvider(resource=resource, sampler=head_sampler(sample_ratio))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif otlp_endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise ValueError(
                "ORRERY_OTLP_ENDPOINT is set but the OTLP exporter is not installed: "
                "pip install 'orrery[otlp]'"
            ) from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    else:
        return Tracing(provider, exporting=False)
    return Tracing(provider)
