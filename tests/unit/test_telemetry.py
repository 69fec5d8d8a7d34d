"""The request path's deferred metrics and the ids-only tracing (`orrery.telemetry`,
`orrery.tracing`): what the request thread queues, a scrape counts exactly."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest

from contracts.request_context import RequestContext
from orrery import telemetry
from orrery.startup import ExpectedFailure, load_settings
from orrery.telemetry import Metrics, Observability, RequestTelemetry, query_observer
from orrery.tracing import head_sampler, open_tracing
from query.ports import Answered
from query.settings import QuerySettings

ROUTES = ("/healthz", "/v1/external/retrieve/topk_records", "<unmatched>")

requests_ = st.lists(
    st.tuples(
        st.sampled_from(ROUTES),
        st.sampled_from((200, 404, 422, 503)),
        st.floats(min_value=0.0, max_value=2.0),
        st.booleans(),  # a scrape right after this request
    ),
    max_size=60,
)


def _value(metrics: Metrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@settings(max_examples=60, deadline=None)
@given(requests_, st.integers(min_value=0, max_value=3))
def test_scrapes_count_exactly_what_the_requests_queued(
    sequence: list[tuple[str, int, float, bool]], answers: int
) -> None:
    metrics = Metrics(["serve"])
    answer = Answered("topk", {"scope_resolve": 0.1, "rerank": 0.4}, {"t": 0.2}, "hit", {"x": 3})
    for route, status, seconds, scrape in sequence:
        code = None if status == 200 else f"code_{status}"
        metrics.request(route, "GET", status, seconds, code, None)
        if scrape:
            generate_latest(metrics.registry)
    for _ in range(answers):
        metrics.answered(answer)
    for route in ROUTES:
        for status in (200, 404, 422, 503):
            expected = sum(1 for r, s, _, _ in sequence if (r, s) == (route, status))
            got = _value(
                metrics,
                "orrery_http_request_duration_seconds_count",
                {"route": route, "method": "GET", "status": str(status)},
            )
            assert got == expected
    for status in (404, 422, 503):
        expected = sum(1 for _, s, _, _ in sequence if s == status)
        got = _value(metrics, "orrery_errors_total", {"code": f"code_{status}", "dependency": ""})
        assert got == expected
    stage = {"endpoint": "topk", "stage": "rerank"}
    assert _value(metrics, "orrery_query_stage_duration_seconds_count", stage) == answers
    assert _value(metrics, "orrery_query_cache_total", {"result": "hit"}) == answers
    assert not metrics._requests and not metrics._answers  # all folded by the scrape


def test_scrapes_on_another_thread_lose_nothing() -> None:
    metrics = Metrics(["serve"])
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            generate_latest(metrics.registry)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for _ in range(20_000):
            metrics.request("/healthz", "GET", 200, 0.001, None, None)
    finally:
        stop.set()
        scraper.join()
    labels = {"route": "/healthz", "method": "GET", "status": "200"}
    assert _value(metrics, "orrery_http_request_duration_seconds_count", labels) == 20_000


def test_the_queue_is_bounded_without_scrapes() -> None:
    metrics = Metrics(["serve"])
    for _ in range(telemetry.MAX_PENDING * 2 + 5):
        metrics.request("/healthz", "GET", 200, 0.001, None, None)
    assert len(metrics._requests) <= telemetry.MAX_PENDING


def _call(app: Any, headers: list[tuple[bytes, bytes]]) -> list[Any]:
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": headers}
    asyncio.run(app(scope, receive, send))
    return sent


def test_tracing_without_an_exporter_gives_ids_and_no_spans() -> None:
    tracing = open_tracing(None, service="t", roles=["serve"])
    assert not tracing.exporting
    seen: list[RequestContext] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        from contracts.request_context import current

        context = current()
        assert context is not None
        seen.append(context)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    observability = Observability(tracing=tracing)
    app = RequestTelemetry(inner, observability=observability)
    caller = "4bf92f3577b34da6a3ce929d0e0e4736"
    _call(app, [(b"traceparent", f"00-{caller}-00f067aa0ba902b7-01".encode())])
    _call(app, [(b"traceparent", b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01")])
    _call(app, [])
    continued, invalid, fresh = seen
    assert continued.trace_id == caller
    assert continued.traceparent is not None
    assert continued.traceparent.startswith(f"00-{caller}-")
    assert not continued.traceparent.startswith(f"00-{caller}-00f067aa0ba902b7")
    assert invalid.trace_id != "0" * 32 and len(invalid.trace_id or "") == 32
    assert fresh.trace_id != invalid.trace_id
    # No spans: the query observer is the metrics alone (or nothing).
    assert query_observer(observability) is None
    tracing.close()


def test_access_lines_leave_in_order_and_close_writes_them_all() -> None:
    import logging

    from orrery.logs import AccessLog

    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("orrery.test-access")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(Collect())
    access = AccessLog(logger)
    for i in range(500):
        access.line("GET", "/healthz", "/healthz", 200, 0.001, (f"r{i}", None, "ns"), None)
    assert access.flush()  # every line queued before it is written
    assert [r.request_id for r in records] == [f"r{i}" for i in range(500)]  # type: ignore[attr-defined]
    assert records[0].http["route"] == "/healthz"  # type: ignore[attr-defined]
    assert records[0].getMessage() == "GET /healthz 200 1.0ms"
    access.line("GET", "/later", "/later", 404, 0.002, ("after", None, None), "not_found")
    access.close()  # a closed writer starts again for a later line
    assert records[-1].request_id == "after"  # type: ignore[attr-defined]
    assert access.flush()  # nothing running: nothing to wait for


_ANSWER = Answered(
    "topk",
    {"scope_resolve": 0.1, "candidate_fetch": 0.5, "index_search": 1.2, "rerank": 0.3,
     "payload_materialize": 0.2},
    {"tantivy_search": 0.8},
    "miss",
    {"lexical": 10},
)  # fmt: skip

ROUTE_SPAN = "GET <unmatched>"  # the route of a scope without one
callers = st.one_of(
    st.none(),
    st.tuples(
        st.integers(min_value=1, max_value=2**128 - 1).map(lambda n: format(n, "032x")),
        st.booleans(),  # the caller's sampled flag
    ),
)


@settings(max_examples=80, deadline=None)
@given(ratio=st.floats(min_value=0.0, max_value=1.0), caller=callers)
def test_head_sampling_follows_the_caller_and_always_keeps_the_ids(
    ratio: float, caller: tuple[str, bool] | None
) -> None:
    """`ORRERY_TRACING_SAMPLE_RATIO`: a caller's sampled flag decides whatever the ratio;
    without a caller, ratio 0 makes no span and 1 always does. Either way the request
    has its W3C ids, its `traceparent`'s flag says whether spans were made, and a
    sampled request makes its own span and one per stage of its answer."""
    exporter = InMemorySpanExporter()
    tracing = open_tracing(
        None, service="t", roles=["serve"], exporter=exporter, sample_ratio=ratio
    )
    observability = Observability(tracing=tracing)
    observer = query_observer(observability)
    seen: list[RequestContext] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        from contracts.request_context import current

        context = current()
        assert context is not None
        seen.append(context)
        observer.answered(_ANSWER)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    headers = []
    if caller is not None:
        flag = "01" if caller[1] else "00"
        headers = [(b"traceparent", f"00-{caller[0]}-00f067aa0ba902b7-{flag}".encode())]
    _call(RequestTelemetry(inner, observability=observability), headers)
    tracing.close()
    (context,) = seen
    assert context.trace_id is not None and len(context.trace_id) == 32
    assert context.trace_id != "0" * 32
    assert context.traceparent is not None
    _, trace_id, span_id, flags = context.traceparent.split("-")
    assert trace_id == context.trace_id and span_id != "00f067aa0ba902b7"
    spans = exporter.get_finished_spans()
    sampled = bool(spans)
    assert int(flags, 16) & 1 == sampled  # W3C sampled bit (the SDK may set "random", 02)
    if caller is not None:
        assert context.trace_id == caller[0]
        assert sampled == caller[1]
    elif ratio == 0.0:
        assert not sampled
    elif ratio == 1.0:
        assert sampled
    if sampled:
        assert {format(s.context.trace_id, "032x") for s in spans} == {context.trace_id}
        assert sorted(s.name for s in spans) == sorted(
            [ROUTE_SPAN, *(f"query.{stage}" for stage in _ANSWER[1])]
        )


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan", "half"])
def test_a_sample_ratio_outside_0_1_is_refused_at_startup(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORRERY_TRACING_SAMPLE_RATIO", value)
    with pytest.raises(ExpectedFailure, match="ORRERY_TRACING_SAMPLE_RATIO"):
        load_settings()
    with pytest.raises(ValueError):
        head_sampler(float("nan") if value == "half" else float(value))


def test_the_default_ratio_samples_every_trace() -> None:
    assert QuerySettings.model_fields["tracing_sample_ratio"].default == 1.0


_STAGES = ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize")
_traced_callers = st.one_of(
    st.none(),
    st.just((b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01", None)),  # malformed: a new trace
    st.tuples(
        st.tuples(
            st.integers(min_value=1, max_value=2**128 - 1),
            st.integers(min_value=1, max_value=2**64 - 1),
            st.sampled_from((0x00, 0x01, 0x02, 0x03)),  # sampled and random-trace-id bits
        ).map(lambda t: f"00-{t[0]:032x}-{t[1]:016x}-{t[2]:02x}".encode()),
        st.sampled_from((None, b"congo=t61rcWkgMzE", b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")),
    ),
)


@settings(max_examples=80, deadline=None)
@given(
    caller=_traced_callers,
    answers=st.lists(
        st.dictionaries(
            st.sampled_from(_STAGES), st.floats(min_value=0.0, max_value=80.0), min_size=1
        ),
        max_size=3,
    ),
    status=st.sampled_from((200, 404, 503)),
)
def test_the_span_thread_exports_exactly_the_ids_parents_and_times_of_the_request(
    caller: tuple[bytes, bytes | None] | None, answers: list[dict[str, float]], status: int
) -> None:
    """Spans are made by the span thread from what the request's thread recorded: the
    request span has the ids of the request's `traceparent` (the ids a write carries, and
    `query_plan.trace_id`), the caller's span as its remote parent (and its
    `tracestate`), the request's start and end; each answer's stage spans are its
    children, laid end to end with exactly the plan's durations, the last ending when
    the answer was made. The tracing module's clock is a fake that ticks a second and a
    bit per reading: every time is compared exactly."""
    import itertools
    import types

    from opentelemetry.trace import SpanKind, StatusCode

    from contracts.request_context import current
    from orrery import tracing as tracing_module

    exporter = InMemorySpanExporter()
    tracing = open_tracing(None, service="t", roles=["serve"], exporter=exporter)
    observer = query_observer(Observability(tracing=tracing))
    seen: list[RequestContext] = []
    readings: list[int] = []
    ticks = itertools.count(1_700_000_000_000_000_000, 1_000_000_007)

    def time_ns() -> int:
        readings.append(next(ticks))
        return readings[-1]

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        context = current()
        assert context is not None
        seen.append(context)
        for stages in answers:
            observer.answered(Answered("topk", stages, {"tantivy_search": 0.5}, "miss", {}))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    headers: list[tuple[bytes, bytes]] = []
    if caller is not None:
        headers.append((b"traceparent", caller[0]))
        if caller[1] is not None:
            headers.append((b"tracestate", caller[1]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tracing_module, "time", types.SimpleNamespace(time_ns=time_ns))
        _call(RequestTelemetry(inner, observability=Observability(tracing=tracing)), headers)
    assert tracing.flush()
    spans = exporter.get_finished_spans()
    tracing.close()

    (context,) = seen
    assert context.traceparent is not None
    _, trace_hex, span_hex, flags_hex = context.traceparent.split("-")
    assert trace_hex == context.trace_id
    parsed = _caller_fields(caller[0]) if caller is not None else None
    if parsed is not None and not parsed[2] & 1:
        # The caller did not sample: nothing is made, its trace id is continued.
        assert spans == () and int(trace_hex, 16) == parsed[0]
        assert int(flags_hex, 16) == parsed[2]
        return
    *stage_spans, request = spans
    assert request.kind == SpanKind.SERVER and request.name == ROUTE_SPAN
    assert request.context.trace_id == int(trace_hex, 16)
    assert request.context.span_id == int(span_hex, 16)
    assert int(request.context.trace_flags) == int(flags_hex, 16)
    if parsed is None:
        assert request.parent is None
        assert int(flags_hex, 16) == 0x03  # sampled, random trace id
    else:
        assert request.parent is not None and request.parent.is_remote
        assert (request.parent.trace_id, request.parent.span_id) == parsed[:2]
        assert int(flags_hex, 16) == parsed[2]
        state = caller[1] if caller is not None else None
        assert request.context.trace_state.to_header() == (state or b"").decode()
    # The request's thread read the clock at its start, once per answer, at its end.
    started, *answered_at, ended = readings
    assert len(answered_at) == len(answers)
    assert (request.start_time, request.end_time) == (started, ended)
    assert request.attributes is not None
    assert request.attributes["http.response.status_code"] == status
    assert (request.status.status_code == StatusCode.ERROR) == (status >= 500)
    assert len(stage_spans) == sum(len(stages) for stages in answers)
    at = 0
    for stages, answer_end in zip(answers, answered_at, strict=True):
        mine = stage_spans[at : at + len(stages)]
        at += len(stages)
        assert [s.name for s in mine] == [f"query.{stage}" for stage in stages]
        for span, ms in zip(mine, stages.values(), strict=True):
            assert span.parent is not None and not span.parent.is_remote
            assert span.parent.span_id == request.context.span_id
            assert span.context.trace_id == request.context.trace_id
            assert (span.end_time or 0) - (span.start_time or 0) == int(ms * 1e6)
        for left, right in itertools.pairwise(mine):
            assert left.end_time == right.start_time
        # The answer's end, read when it was made: the stages end there (but for the
        # rounding of each duration to whole nanoseconds).
        rounding = int(sum(stages.values()) * 1e6) - sum(int(ms * 1e6) for ms in stages.values())
        assert (mine[-1].end_time or 0) + rounding == answer_end


def _caller_fields(value: bytes) -> tuple[int, int, int] | None:
    """A well-formed version-00 `traceparent`'s trace id, span id and flags (else None)."""
    version, trace_id, span_id, flags = value.decode().split("-")
    if version != "00" or int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return None
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)
