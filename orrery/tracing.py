"""OpenTelemetry spans (`ORRERY_TRACING=true`): one per HTTP request, one per query stage.

A request's span continues the caller's W3C `traceparent` when it sends one; its trace id
is the request's (`contracts.request_context`: log lines, `query_plan.trace_id`). Query
stage spans are children of the request span, laid end to end from the stopwatch the
query already keeps (`query_plan.latency_ms`): their durations are the plan's, so they
sum to the query's time without a clock read per stage.

Spans are exported over OTLP/HTTP when `ORRERY_OTLP_ENDPOINT` is set (the optional
`otlp` extra: `pip install 'orrery[otlp]'`); tests pass an in-memory exporter. Without
either no span is made at all: each request still gets its W3C ids — the caller's
trace id continued, a new span id — so log lines, `query_plan.trace_id` and the
`traceparent` a write carries through the outbox and Kafka are the same as with spans.

The request's thread makes no span either way. It draws the request's ids, takes the
head sampler's decision (`HeadSampler.sampled`: the SDK's rule without its objects), and
reads the clock at the start and the end; a sampled request's facts (ids, times, route,
status, the answers its queries made) are then one tuple queued for `SpanMaker`, which
makes the SDK spans with exactly those ids and times (the provider's id generator hands
them over, `_HandedIds`). With an OTLP endpoint that happens in the exporter child
(`orrery.span_exporter`: a process of its own, fed one pickled batch per 200 ms, bounded,
drops and restarts counted): making and exporting spans cost ~0.6 ms of Python per
request, and on the serving interpreter that time held the GIL the request threads
wait for (+14 % at p50 at ratio 1.0). With an exporter object (tests) a span thread of
this process makes them (`SpanThread`). Making the spans on the request's thread cost
~370 us of it per request; see `bench/metrics_overhead.py`. `Tracing.flush` waits
until every span queued before it is made and exported.

Spans are sampled at the head (`ORRERY_TRACING_SAMPLE_RATIO`, the SDK's
`ParentBased(TraceIdRatioBased(ratio))`): a request continuing a caller's trace follows
the caller's sampled flag; any other request, and each projector batch, is sampled with
probability `ratio` by its trace id. The request's thread decides itself (the SDK's
sampler decides again, from the same ids, when the span is made: the decision depends
on the trace id and the parent's flag only). An unsampled request
queues nothing but keeps its W3C ids, as above; its `traceparent` says "not sampled"
(flags `00`), so the services it calls and the writes it carries do not sample it either.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import random
import re
import threading
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Scope

from contracts.request_context import RequestContext
from query.ports import Answered

if TYPE_CHECKING:
    from orrery.span_exporter import ExporterChild

__all__ = [
    "HeadSampler",
    "SpanMaker",
    "SpanThread",
    "Tracing",
    "head_sampler",
    "open_tracing",
    "tracer_provider",
]

_PROPAGATOR = TraceContextTextMapPropagator()
# A W3C `traceparent`: version, trace id, parent span id, flags (version 00's four
# fields; a later version may append more, which are ignored).
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_NO_TRACE = b"0" * 32
_NO_SPAN = b"0" * 16
_SAMPLED = int(TraceFlags.SAMPLED)
_RANDOM = int(TraceFlags.RANDOM_TRACE_ID)
# The parent of a request without a caller: an empty context, never the thread's current
# one (the sampler and the SDK would read that).
_ROOT = Context()
# The answers a traced request made, for `Tracing.end_request` (set per request).
_ANSWERS: ContextVar[list[tuple[int, Answered]] | None] = ContextVar(
    "orrery_trace_answers", default=None
)
_log = logging.getLogger("orrery.tracing")

# A caller's `traceparent` as the request's thread read it: trace id, parent span id,
# flags, and its raw `tracestate` header (or None).
_Caller = tuple[int, int, int, bytes | None]


class _HandedIds(IdGenerator):
    """The SDK's random ids, except on a thread that was handed the ids of the next span
    (`hand`): the span thread makes a request's span with the ids its request drew."""

    def __init__(self) -> None:
        self._handed = threading.local()

    def hand(self, trace_id: int, span_id: int) -> None:
        self._handed.ids = (trace_id, span_id)

    def take_back(self) -> None:
        self._handed.ids = None

    def generate_span_id(self) -> int:
        ids = getattr(self._handed, "ids", None)
        if ids is not None:
            self._handed.ids = None
            return int(ids[1])
        return _new_span_id()

    def generate_trace_id(self) -> int:
        # The SDK asks for a trace id only for a root span, and before its span id.
        ids = getattr(self._handed, "ids", None)
        if ids is not None:
            return int(ids[0])
        return _new_trace_id()

    def is_trace_id_random(self) -> bool:
        return True


def _new_span_id() -> int:
    span_id = random.getrandbits(64)
    while span_id == 0:
        span_id = random.getrandbits(64)
    return span_id


def _new_trace_id() -> int:
    trace_id = random.getrandbits(128)
    while trace_id == 0:
        trace_id = random.getrandbits(128)
    return trace_id


def tracer_provider(sampler: Sampler, resource: Resource | None = None) -> TracerProvider:
    """A `TracerProvider` a `Tracing` can make request spans with (its id generator takes
    the ids the request's thread drew); add the span processor to it."""
    return TracerProvider(
        resource=resource or Resource.create({}), sampler=sampler, id_generator=_HandedIds()
    )


class SpanMaker:
    """Makes the SDK spans of what a request's thread (or a projector batch) recorded,
    with exactly its ids and times: the span thread's work, and the exporter child's
    (`orrery.span_exporter`), from the same queued tuples."""

    def __init__(self, provider: TracerProvider) -> None:
        if not isinstance(provider.id_generator, _HandedIds):
            raise ValueError("make the provider with orrery.tracing.tracer_provider")
        self.tracer = provider.get_tracer("orrery")
        self._ids = provider.id_generator

    def make(self, item: tuple[Any, ...]) -> None:
        """The spans of one queued item: a request's (`Tracing.end_request`) or a
        projector batch's (`_BATCH` first)."""
        if item[0] == _BATCH:
            self.batch_span(*item[1:])
        else:
            self.request_spans(*item)

    def request_spans(
        self,
        request: tuple[int, int, _Caller | None, int, str, list[tuple[int, Answered]]],
        ended: int,
        route: str,
        status: int,
        request_id: str,
        error_code: str | None,
    ) -> None:
        trace_id, span_id, caller, started, method, answers = request
        parent = _ROOT
        if caller is not None:
            _, parent_id, caller_flags, tracestate = caller
            state = TraceState.from_header([tracestate.decode("latin-1")]) if tracestate else None
            remote = SpanContext(trace_id, parent_id, True, TraceFlags(caller_flags), state)
            parent = trace.set_span_in_context(NonRecordingSpan(remote), _ROOT)
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "http.route": route,
            "http.response.status_code": status,
            "orrery.request_id": request_id,
        }
        if error_code is not None:
            attributes["orrery.error_code"] = error_code
        self._ids.hand(trace_id, span_id)
        try:
            span = self.tracer.start_span(
                f"{method} {route}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attributes,
                start_time=started,
            )
        finally:
            self._ids.take_back()
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, error_code or str(status)))
        if answers:
            under = trace.set_span_in_context(span, _ROOT)
            for end, answer in answers:
                self.stage_spans(answer, end, under)
        span.end(end_time=ended)

    def stage_spans(self, answer: Answered, end: int, parent: Any) -> None:
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

    def batch_span(
        self,
        started: int,
        ended: int,
        facts: tuple[int, int, int] | None,
        trace_contexts: list[str],
        error: str | None,
    ) -> None:
        """A `projector.batch` span: linked to the writes it applied (`facts`: events,
        position, embedded), or an error span for a failed batch."""
        if error is not None:
            span = self.tracer.start_span("projector.batch", start_time=started)
            span.set_status(Status(StatusCode.ERROR, error))
        else:
            assert facts is not None
            events, position, embedded = facts
            links = [Link(c) for c in map(_span_context, trace_contexts) if c]
            span = self.tracer.start_span(
                "projector.batch",
                start_time=started,
                links=links,
                attributes={
                    "orrery.events": events,
                    "orrery.position": position,
                    "orrery.embedded": embedded,
                },
            )
        span.end(end_time=ended)


# The first field of a queued projector batch (a request's is its ids' tuple).
_BATCH = "batch"


class SpanThread:
    """Makes the queued spans on a daemon thread of this process (started with the first
    item), with the provider's own span processor: spans given to an exporter object
    (tests: in memory). Unbounded; `flush` waits for what was queued before it."""

    _STOP = object()

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.maker = SpanMaker(provider)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, item: tuple[Any, ...]) -> None:
        if self._thread is None:
            self._start()
        self._queue.put(item)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="orrery-spans", daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self.maker.make(item)
            except Exception:  # a processor's failure must not end the span thread
                _log.exception("span not made")

    def flush(self, timeout: float) -> bool:
        if self._thread is not None:
            made = threading.Event()
            self._queue.put(made)
            if not made.wait(timeout):
                return False
        return self.provider.force_flush(int(timeout * 1000))

    def status(self) -> dict[str, Any]:
        return {"exporter": "thread", "dropped": 0, "restarts": 0}

    def close(self) -> None:
        """Make every queued span and stop the thread (the provider is `Tracing`'s)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(self._STOP)
            thread.join(timeout=30)


class Tracing:
    """Spans of one process. The request's thread draws ids, asks the sampler and queues
    one tuple per sampled request to `spans`: an `ExporterChild` (OTLP: the spans are
    made and exported by a child process, off this interpreter's GIL) or a `SpanThread`
    (an exporter object, tests). `spans` None: ids only, no spans (see the module
    docstring); then `wrap_projector_step` and `answered` are not used. `close` makes
    and exports every queued span first."""

    def __init__(
        self,
        provider: TracerProvider,
        spans: SpanThread | ExporterChild | None = None,
    ) -> None:
        if not isinstance(provider.id_generator, _HandedIds):
            raise ValueError("make the provider with orrery.tracing.tracer_provider")
        self.provider = provider
        self.sampler = provider.sampler
        self._head = self.sampler if isinstance(self.sampler, HeadSampler) else None
        self.spans = spans
        self.exporting = spans is not None
        self._lock = threading.Lock()
        self._closed = False
        if spans is not None:
            atexit.register(self.close)

    # --- HTTP requests (on the request's thread) -------------------------------------

    def start_request(self, scope: Scope, context: RequestContext) -> Any:
        """Set the request's `trace_id` and `traceparent`; returns the handle
        `end_request` takes (None: not exporting, or not sampled: nothing to make)."""
        if not self.exporting:
            _ids_only(scope, context)
            return None
        caller = _caller(scope)
        span_id = _new_span_id()
        trace_id = _new_trace_id() if caller is None else caller[0]
        random_id = _RANDOM if caller is None else caller[2] & _RANDOM  # `_HandedIds`: random
        method = scope["method"]
        if self._head is not None:
            # The head sampler's decision without the SDK's objects (~15 us of them).
            sampled = self._head.sampled(trace_id, None if caller is None else caller[2])
        else:
            parent = _ROOT
            if caller is not None:
                remote = SpanContext(trace_id, caller[1], True, TraceFlags(caller[2]))
                parent = trace.set_span_in_context(NonRecordingSpan(remote), _ROOT)
            decision = self.sampler.should_sample(parent, trace_id, method, SpanKind.SERVER)
            sampled = decision.decision is Decision.RECORD_AND_SAMPLE
        flags = random_id | (_SAMPLED if sampled else 0)
        context.trace_id = format(trace_id, "032x")
        context.traceparent = f"00-{context.trace_id}-{span_id:016x}-{flags:02x}"
        if not flags & _SAMPLED:
            return None
        answers: list[tuple[int, Answered]] = []
        return (trace_id, span_id, caller, time.time_ns(), method, answers), _ANSWERS.set(answers)

    def end_request(self, handle: Any, route: str, status: int, context: RequestContext) -> None:
        """Queue the request's spans (its own and one per stage of each answer it made,
        `answered`); runs once the response has left."""
        if handle is None or self.spans is None:
            return
        request, answers_token = handle
        _ANSWERS.reset(answers_token)
        ended = time.time_ns()
        self.spans.put((request, ended, route, status, context.request_id, context.error_code))

    # --- queries (query.ports.QueryObserver) -----------------------------------------

    def answered(self, answer: Answered) -> None:
        """One child span per stage of the answer just made, under the request's span,
        ending now and laid end to end by the stopwatch's durations. Inside a request
        they are made with the request's span; outside one, with a `SpanThread`, here
        under the current span (none: no spans)."""
        pending = _ANSWERS.get()
        if pending is not None:
            pending.append((time.time_ns(), answer))
        elif (
            isinstance(self.spans, SpanThread)
            and trace.get_current_span().get_span_context().is_valid
        ):
            self.spans.maker.stage_spans(answer, time.time_ns(), None)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every span queued before this call is made and handed to the
        exporter (True), or `timeout` seconds pass (False)."""
        return True if self.spans is None else self.spans.flush(timeout)

    def status(self) -> dict[str, Any]:
        """What readiness and `/metrics` report of the span export: `exporter` (`child`
        running, `restarting`, `idle` before the first span; `thread`), `dropped`
        (sampled requests and batches whose spans were not made: the queue was full or
        the child was down) and `restarts` (exporter children that died)."""
        return {"exporter": "off"} if self.spans is None else self.spans.status()

    # --- the projector -------------------------------------------------------------

    def wrap_projector_step(self, step: Callable[[], Any]) -> Callable[[], Any]:
        """`step` (a projector batch returning a `BatchReport`) with a `projector.batch`
        span for each batch that applied events, linked to the spans of the writes it
        applied (their trace contexts came along through the outbox row, and in server
        mode the Kafka headers). A failed batch gets an error span. With an exporter
        child the span is made there (queued like a request's)."""
        spans = self.spans

        def traced() -> Any:
            started = time.time_ns()
            try:
                report = step()
            except Exception as exc:
                self._batch(spans, (_BATCH, started, time.time_ns(), None, [], type(exc).__name__))
                raise
            if report.events:
                facts = (report.events, report.position, report.embedded)
                contexts = list(report.trace_contexts)
                self._batch(spans, (_BATCH, started, time.time_ns(), facts, contexts, None))
            return report

        return traced

    @staticmethod
    def _batch(spans: SpanThread | ExporterChild | None, item: tuple[Any, ...]) -> None:
        if isinstance(spans, SpanThread):
            spans.maker.make(item)  # on the projector's thread, as it always was
        elif spans is not None:
            spans.put(item)

    def close(self) -> None:
        """Make and export every queued span, stop the span thread or the exporter
        child, shut the provider down. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.spans is not None:
            atexit.unregister(self.close)
            self.spans.close()
        self.provider.shutdown()


def _caller(scope: Scope) -> _Caller | None:
    """The caller's well-formed `traceparent` (W3C: version not ff, neither id all
    zeros; version 00 has exactly four fields) and its `tracestate`, or None."""
    traceparent = tracestate = None
    for name, value in scope["headers"]:
        if name == b"traceparent":
            if traceparent is None:
                traceparent = value
        elif name == b"tracestate":
            tracestate = value
    if traceparent is None:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if (
        match is None
        or match[1] == b"ff"
        or (match[1] == b"00" and match[5] is not None)
        or match[2] == _NO_TRACE
        or match[3] == _NO_SPAN
    ):
        return None
    return int(match[2], 16), int(match[3], 16), int(match[4], 16), tracestate


def _ids_only(scope: Scope, context: RequestContext) -> None:
    """A request's W3C ids without a span: the caller's trace id and flags when its
    `traceparent` is well formed, else a new trace id, and a new span id."""
    caller = _caller(scope)
    if caller is None:
        trace_id, flags = os.urandom(16).hex(), "01"
    else:
        trace_id, flags = format(caller[0], "032x"), format(caller[2], "02x")
    context.trace_id = trace_id
    context.traceparent = f"00-{trace_id}-{os.urandom(8).hex()}-{flags}"


def _span_context(traceparent: str) -> SpanContext | None:
    """The remote span a W3C `traceparent` names, or None for a malformed one."""
    carried = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent}))
    context = carried.get_span_context()
    return context if context.is_valid else None


class HeadSampler(ParentBased):
    """The SDK's `ParentBased(TraceIdRatioBased(ratio))` (its default delegates: a remote
    parent's sampled flag decides), whose decision a request's thread can also take
    without the SDK's objects (`sampled`): the same rule, so the exporter child, asking
    the SDK, decides the same from the same ids."""

    def __init__(self, ratio: float) -> None:
        root = TraceIdRatioBased(ratio)
        super().__init__(root)
        self.bound = root.bound

    def sampled(self, trace_id: int, caller_flags: int | None) -> bool:
        """The decision for a request: its caller's sampled flag, or (no caller) its
        trace id's low 64 bits under the ratio's bound (`TraceIdRatioBased`)."""
        if caller_flags is not None:
            return bool(caller_flags & _SAMPLED)
        return trace_id & _TRACE_ID_LIMIT < self.bound


_TRACE_ID_LIMIT = TraceIdRatioBased.TRACE_ID_LIMIT


def head_sampler(ratio: float) -> HeadSampler:
    """The SDK's `ParentBased(TraceIdRatioBased(ratio))` (`HeadSampler`): a span with a
    parent is sampled as its parent was (a caller's `traceparent` flag), a root span with
    probability `ratio` by its trace id. `ValueError` outside [0, 1]."""
    if not 0.0 <= ratio <= 1.0:  # also refuses NaN
        raise ValueError(f"the trace sample ratio must be in [0, 1], not {ratio!r}")
    return HeadSampler(ratio)


def open_tracing(
    otlp_endpoint: str | None,
    *,
    service: str,
    roles: Iterable[str],
    exporter: SpanExporter | None = None,
    sample_ratio: float = 1.0,
    max_pending: int = 10_000,
) -> Tracing:
    """A `Tracing` whose spans go to `exporter` (made on the span thread, each exported
    as it is made: tests), else to the OTLP endpoint (made and exported in batches by an
    exporter child process, `orrery.span_exporter`; at most `max_pending` items wait for
    it, more are dropped and counted), else one that makes no spans (`exporting`
    False). Spans are sampled by `head_sampler(sample_ratio)`."""
    resource_attributes = {"service.name": service, "orrery.roles": ",".join(sorted(roles))}
    provider = tracer_provider(head_sampler(sample_ratio), Resource.create(resource_attributes))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return Tracing(provider, SpanThread(provider))
    if otlp_endpoint:
        from orrery.span_exporter import ExporterChild, otlp_exporter

        otlp_exporter(otlp_endpoint)  # the extra is installed (else ValueError, at startup)
        child = ExporterChild(
            otlp_endpoint,
            resource_attributes=resource_attributes,
            sample_ratio=sample_ratio,
            max_pending=max_pending,
        )
        return Tracing(provider, child)
    return Tracing(provider)
