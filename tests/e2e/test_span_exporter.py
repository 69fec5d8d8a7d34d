"""The exporter child (`orrery.span_exporter`): the spans it makes in its own process
and exports over OTLP/HTTP to a receiver on loopback carry exactly the ids, parents and
times the request threads recorded; `close` exports what was queued; a full queue drops
and counts; a killed child is noticed, counted and replaced."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

from contracts.request_context import current
from orrery import tracing as tracing_module
from orrery.telemetry import (
    Metrics,
    Observability,
    RequestTelemetry,
    TracingCollector,
    query_observer,
)
from orrery.tracing import Tracing, open_tracing
from query.ports import Answered
from tests.harness.otlp import OtlpReceiver

STAGES = ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize")


def _call(app: Any, headers: list[tuple[bytes, bytes]]) -> None:
    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/q", "headers": headers}
    asyncio.run(app(scope, receive, send))


def _poll(until: Callable[[], bool], what: Callable[[], Any], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


def _requests(tracing: Tracing, n: int) -> None:
    app = RequestTelemetry(_answering([]), observability=Observability(tracing=tracing))
    for _ in range(n):
        _call(app, [])


def _answering(answers: list[dict[str, float]], status: int = 200, observer: Any = None) -> Any:
    async def inner(scope: Any, receive: Any, send: Any) -> None:
        for stages in answers:
            observer.answered(Answered("topk", stages, {"tantivy_search": 0.5}, "miss", {}))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return inner


def test_the_child_exports_exactly_the_ids_parents_and_times_recorded(
    receiver: OtlpReceiver,
) -> None:
    """Requests of every kind (a new trace, a sampled caller with and without
    `tracestate`, a caller that did not sample, 0-3 answers, 200/404/503) and a
    projector batch, with the tracing module's clock a fake that ticks a second and a
    bit per reading; `close` without a flush: every span reaches the receiver, each
    time equal to the reading it came from."""
    tracing = open_tracing(receiver.endpoint, service="t", roles=["serve"])
    observer = query_observer(Observability(tracing=tracing))
    rng = random.Random(25)
    readings: list[int] = []
    ticks = itertools.count(1_700_000_000_000_000_000, 1_000_000_007)

    def time_ns() -> int:
        readings.append(next(ticks))
        return readings[-1]

    callers: list[tuple[bytes, bytes | None] | None] = [
        None,
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b8-03", b"congo=t61rcWkgMzE"),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4738-00f067aa0ba902b9-00", None),  # not sampled
    ]
    # (traceparent, caller, answers, status, the clock readings of the request)
    made: list[tuple[str, Any, list[dict[str, float]], int, list[int]]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tracing_module, "time", types.SimpleNamespace(time_ns=time_ns))
        for i in range(16):
            caller = callers[i % len(callers)]
            answers = [
                {s: round(rng.uniform(0, 80), 3) for s in rng.sample(STAGES, rng.randint(1, 5))}
                for _ in range(rng.randint(0, 3))
            ]
            status = rng.choice((200, 404, 503))
            seen: list[str] = []

            async def inner(
                scope: Any,
                receive: Any,
                send: Any,
                *,
                seen: list[str] = seen,
                app: Any = _answering(answers, status, observer),
            ) -> None:
                context = current()
                assert context is not None and context.traceparent is not None
                seen.append(context.traceparent)
                await app(scope, receive, send)

            headers: list[tuple[bytes, bytes]] = []
            if caller is not None:
                headers.append((b"traceparent", caller[0]))
                if caller[1] is not None:
                    headers.append((b"tracestate", caller[1]))
            first = len(readings)
            _call(RequestTelemetry(inner, observability=Observability(tracing=tracing)), headers)
            made.append((seen[0], caller, answers, status, readings[first:]))
        started_batch = len(readings)
        report = types.SimpleNamespace(
            events=2,
            position=7,
            embedded=2,
            trace_contexts=[made[1][0], "not a traceparent"],
        )
        tracing.wrap_projector_step(lambda: report)()
        batch_times = readings[started_batch:]
    tracing.close()

    sampled = [m for m in made if m[0].endswith("-01") or m[0].endswith("-03")]
    expected = len(sampled) + sum(len(s) for m in sampled for s in m[2]) + 1
    _poll(lambda: len(receiver.received()) >= expected, receiver.received)
    spans = receiver.received()
    assert len(spans) == expected
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == expected
    for traceparent, caller, answers, status, times in made:
        _, trace_hex, span_hex, flags = traceparent.split("-")
        if not int(flags, 16) & 1:
            assert span_hex not in by_id and not any(s.trace_id == trace_hex for s in spans)
            continue
        request = by_id[span_hex]
        assert (request.trace_id, request.name) == (trace_hex, "POST <unmatched>")
        assert request.parent_span_id == ("" if caller is None else caller[0].decode()[36:52])
        assert request.trace_state == ("" if caller is None else (caller[1] or b"").decode())
        started, *answered_at, ended = times
        assert (request.start_ns, request.end_ns) == (started, ended)
        assert request.error == (status >= 500)
        assert ("http.response.status_code", str(status)) in request.attributes
        children = sorted(
            (s for s in spans if s.parent_span_id == span_hex), key=lambda s: s.start_ns
        )
        assert all(s.trace_id == trace_hex for s in children)
        assert len(children) == sum(len(stages) for stages in answers)
        at = 0
        for stages, answer_end in zip(answers, answered_at, strict=True):
            mine = children[at : at + len(stages)]
            at += len(stages)
            assert sorted(s.name for s in mine) == sorted(f"query.{s}" for s in stages)
            for span in mine:
                ms = stages[span.name.removeprefix("query.")]
                assert span.end_ns - span.start_ns == int(ms * 1e6)
            rounding = int(sum(stages.values()) * 1e6) - sum(int(v * 1e6) for v in stages.values())
            assert mine[-1].end_ns + rounding == answer_end
    (batch,) = [s for s in spans if s.name == "projector.batch"]
    assert (batch.start_ns, batch.end_ns) == tuple(batch_times)
    written = made[1][0].split("-")
    assert batch.links == ((written[1], written[2]),)


def test_a_full_queue_drops_and_counts_and_a_closed_one_too(receiver: OtlpReceiver) -> None:
    """At most `max_pending` items wait for the child: the rest are dropped and counted
    (status and `/metrics`), never silently; the queued ones are exported."""
    tracing = open_tracing(receiver.endpoint, service="t", roles=["serve"], max_pending=2)
    child = tracing.spans
    assert child is not None and not isinstance(child, tracing_module.SpanThread)
    metrics = Metrics(["serve"])
    metrics.registry.register(TracingCollector(tracing))
    child.batch_seconds = 3600.0  # the shipper waits for a flush: the queue fills up
    try:
        _requests(tracing, 5)
        assert tracing.status()["dropped"] == 3
        assert tracing.flush(120)
        assert len({s.trace_id for s in receiver.received()}) == 2
        assert metrics.registry.get_sample_value("orrery_trace_dropped_total") == 3.0
    finally:
        tracing.close()
    _requests(tracing, 1)
    assert tracing.status() == {
        "exporter": "closed",
        "dropped": 4,
        "restarts": 0,
        "pending": 0,
        "export_failed": 0,
    }


def test_a_killed_child_is_noticed_counted_and_replaced(receiver: OtlpReceiver) -> None:
    tracing = open_tracing(receiver.endpoint, service="t", roles=["serve"])
    child = tracing.spans
    assert child is not None and not isinstance(child, tracing_module.SpanThread)
    metrics = Metrics(["serve"])
    metrics.registry.register(TracingCollector(tracing))
    try:
        _requests(tracing, 1)
        assert tracing.flush(120)
        assert metrics.registry.get_sample_value("orrery_trace_exporter_up") == 1.0
        pid = child.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the child this test started, by its id
        # Noticed by the shipper's health check (every 5 s), with no request meanwhile.
        _poll(lambda: tracing.status()["restarts"] == 1, tracing.status)
        assert metrics.registry.get_sample_value("orrery_trace_exporter_restarts_total") == 1.0
        _poll(lambda: tracing.status()["exporter"] == "child", tracing.status)
        assert child.pid not in (None, pid)
        _requests(tracing, 1)
        assert tracing.flush(120)
        assert len({s.trace_id for s in receiver.received()}) == 2
        assert tracing.status()["dropped"] == 0
    finally:
        tracing.close()


def test_spans_the_endpoint_refuses_are_counted() -> None:
    """A collector that is not there: the child's exporter gives up after its retries,
    the flush says so and the spans it could not deliver are counted."""
    import socket

    with socket.socket() as closed:  # a port nobody listens on once closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    tracing = open_tracing(f"http://127.0.0.1:{port}/v1/traces", service="t", roles=["serve"])
    metrics = Metrics(["serve"])
    metrics.registry.register(TracingCollector(tracing))
    try:
        _requests(tracing, 2)
        assert tracing.flush(300) is False
        assert tracing.status()["export_failed"] == 2
        assert metrics.registry.get_sample_value("orrery_trace_export_failed_total") == 2.0
    finally:
        tracing.close()
