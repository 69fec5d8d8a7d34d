"""The request path's deferred metrics and the ids-only tracing (`orrery.telemetry`,
`orrery.tracing`): what the request thread queues, a scrape counts exactly."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from contracts.request_context import RequestContext
from orrery import telemetry
from orrery.telemetry import Metrics, Observability, RequestTelemetry, query_observer
from orrery.tracing import open_tracing
from query.ports import Answered

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
