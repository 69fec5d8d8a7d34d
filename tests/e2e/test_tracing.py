"""OpenTelemetry spans of a request and its query stages (in-memory exporter)."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ingest.bootstrap import canonical_db_path
from orrery.embedded import EmbeddedStack
from orrery.tracing import Tracing
from query.settings import QuerySettings
from tests.e2e.test_embedded_http import rec
from tests.fakes import FakeHashingEmbedder

NS = "tracing_ns"
SCOPE = "longterm:objects:current"
STAGES = ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize")


TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


class FlushingExporter(InMemorySpanExporter):
    """The in-memory exporter, read after the stack's span thread has made every request
    span queued so far (`Tracing.flush`): requests' spans are made after they answered."""

    tracing: Tracing | None = None

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        assert self.tracing is not None and self.tracing.flush()
        return super().get_finished_spans()

    def clear(self) -> None:
        assert self.tracing is not None and self.tracing.flush()
        super().clear()


@contextmanager
def _stack(data_dir: Path, **settings: object) -> Iterator[tuple[TestClient, FlushingExporter]]:
    exporter = FlushingExporter()
    stack = EmbeddedStack.open(
        QuerySettings(data_dir=data_dir, tracing=True, projector_poll_seconds=0.02, **settings),
        embedder=FakeHashingEmbedder(dimension=32),
        span_exporter=exporter,
    )
    exporter.tracing = stack.observability.tracing
    stack.start()
    try:
        with TestClient(stack.app) as client:
            yield client, exporter
    finally:
        stack.close()


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[TestClient, FlushingExporter]]:
    with _stack(tmp_path / "data") as traced:
        yield traced


def _outbox_traceparents(data_dir: Path) -> list[str | None]:
    """The `traceparent` each outbox row carries, in write order."""
    with sqlite3.connect(canonical_db_path(data_dir)) as conn:
        rows = conn.execute("SELECT trace_context FROM outbox ORDER BY position").fetchall()
    return [trace for (trace,) in rows]


def _load(client: TestClient) -> None:
    records = [rec(f"t{i}", namespace=NS, title=f"thermos number {i}") for i in range(5)]
    assert client.post("/v1/records", json=records).status_code == 200
    deadline = time.monotonic() + 60
    while not client.get("/v1/readiness").json()["ready"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _children(spans: tuple[ReadableSpan, ...], parent: ReadableSpan) -> list[ReadableSpan]:
    own = parent.get_span_context().span_id
    return [s for s in spans if s.parent is not None and s.parent.span_id == own]


def test_a_query_has_one_span_per_stage_summing_to_its_total(
    traced: tuple[TestClient, FlushingExporter],
) -> None:
    client, exporter = traced
    _load(client)
    exporter.clear()
    response = client.post(
        "/v1/external/retrieve/topk_records",
        json={"namespace": NS, "scope_ref": SCOPE, "query_text": "thermos"},
    )
    assert response.status_code == 200, response.text
    plan = response.json()["query_plan"]
    spans = exporter.get_finished_spans()
    (request,) = [s for s in spans if s.name == "POST /v1/external/retrieve/topk_records"]
    trace_id = format(request.context.trace_id, "032x")
    assert plan["trace_id"] == trace_id
    assert request.attributes is not None and request.attributes["http.response.status_code"] == 200
    stages = {s.name: s for s in _children(spans, request)}
    assert sorted(stages) == sorted(f"query.{stage}" for stage in STAGES)
    seconds = {name: ((s.end_time or 0) - (s.start_time or 0)) / 1e9 for name, s in stages.items()}
    for stage in STAGES:
        assert seconds[f"query.{stage}"] == pytest.approx(
            plan["latency_ms"][stage] / 1000.0, abs=2e-6
        )
    # The stages account for the query's time (what is left is the last lap to `total`).
    total = plan["latency_ms"]["total"] / 1000.0
    assert sum(seconds.values()) == pytest.approx(total, rel=0.1, abs=0.002)
    # And they lie inside the request's span.
    for span in stages.values():
        assert (request.start_time or 0) <= (span.start_time or 0)
        assert (span.end_time or 0) <= (request.end_time or 0)


def test_a_callers_traceparent_is_continued(
    traced: tuple[TestClient, FlushingExporter],
) -> None:
    client, exporter = traced
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = client.get(
        "/healthz", headers={"traceparent": f"00-{caller_trace}-00f067aa0ba902b7-01"}
    )
    assert response.status_code == 200
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "GET /healthz"]
    assert format(span.context.trace_id, "032x") == caller_trace
    assert span.parent is not None and span.parent.span_id == 0x00F067AA0BA902B7


def test_a_projector_batch_span_links_to_the_write_it_applied(
    traced: tuple[TestClient, FlushingExporter],
) -> None:
    client, exporter = traced
    response = client.post("/v1/records", json=[rec("linked", namespace=NS, title="linked")])
    assert response.status_code == 200, response.text
    (write,) = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/records"]
    deadline = time.monotonic() + 60
    while True:
        batches = [
            s
            for s in exporter.get_finished_spans()
            if s.name == "projector.batch"
            and any(link.context.span_id == write.context.span_id for link in s.links)
        ]
        if batches:
            break
        assert time.monotonic() < deadline, [s.name for s in exporter.get_finished_spans()]
        time.sleep(0.05)
    (batch,) = batches
    (link,) = [link for link in batch.links if link.context.span_id == write.context.span_id]
    assert link.context.trace_id == write.context.trace_id
    assert batch.attributes is not None and batch.attributes["orrery.events"] >= 1


@pytest.mark.servers
@pytest.mark.slow
def test_a_write_is_linked_from_the_batch_of_another_process_through_kafka(
    tmp_path: Path,
) -> None:
    """Two stacks that share only the outbox database and Kafka: ingest + relay in one,
    the projector in the other. The projector's batch span links to the write span of
    the other stack: the trace context went outbox row → relay → Kafka header."""
    from typing import Any

    from orrery.servers import Role, ServerStack
    from tests.conftest import run_tag
    from tests.e2e.test_servers_http import server_env

    env = server_env(run_tag(), database=False)
    fields: dict[str, Any] = {k.removeprefix("ORRERY_").lower(): v for k, v in env.items()}
    fields.update(data_dir=tmp_path / "data", tracing=True)
    settings = QuerySettings(**fields)
    writer_spans, projector_spans = FlushingExporter(), FlushingExporter()
    embedder = FakeHashingEmbedder(dimension=32)
    writer = ServerStack.open(
        settings, frozenset({Role.INGEST, Role.RELAY}), embedder=embedder,
        span_exporter=writer_spans,
    )  # fmt: skip
    projector = ServerStack.open(
        settings, frozenset({Role.PROJECTOR}), embedder=embedder, span_exporter=projector_spans
    )
    writer_spans.tracing = writer.observability.tracing
    projector_spans.tracing = projector.observability.tracing
    writer.start()
    projector.start()
    try:
        assert writer.app is not None
        with TestClient(writer.app) as client:
            response = client.post("/v1/records", json=[rec("via-kafka", namespace=NS)])
            assert response.status_code == 200, response.text
        (write,) = [s for s in writer_spans.get_finished_spans() if s.name == "POST /v1/records"]
        deadline = time.monotonic() + 120
        while True:
            linked = [
                s
                for s in projector_spans.get_finished_spans()
                if s.name == "projector.batch"
                and any(link.context.span_id == write.context.span_id for link in s.links)
            ]
            if linked:
                break
            assert time.monotonic() < deadline, "no projector batch linked to the write"
            time.sleep(0.1)
        (link,) = [lk for lk in linked[0].links if lk.context.span_id == write.context.span_id]
        assert link.context.trace_id == write.context.trace_id
    finally:
        projector.close()
        writer.close()


def _sampled(traceparent: str | None) -> bool:
    assert traceparent is not None
    match = TRACEPARENT.fullmatch(traceparent)
    assert match is not None, traceparent
    return bool(int(match[3], 16) & 1)


def test_ratio_0_makes_no_span_but_keeps_every_trace_id(tmp_path: Path) -> None:
    """`ORRERY_TRACING_SAMPLE_RATIO=0`: writes, queries, readiness polls and projector
    batches make no span, yet each request has its own trace id (in `query_plan`, on the
    outbox rows of a write, marked unsampled); a caller's trace id is continued."""
    data_dir = tmp_path / "data"
    with _stack(data_dir, tracing_sample_ratio=0.0) as (client, exporter):
        _load(client)
        query = {"namespace": NS, "scope_ref": SCOPE, "query_text": "thermos"}
        plans = [
            client.post("/v1/external/retrieve/topk_records", json=query).json()["query_plan"]
            for _ in range(2)
        ]
        caller = "4bf92f3577b34da6a3ce929d0e0e4736"
        unsampled = {"traceparent": f"00-{caller}-00f067aa0ba902b7-00"}
        continued = client.post(
            "/v1/external/retrieve/topk_records", json=query, headers=unsampled
        ).json()["query_plan"]
        response = client.post("/v1/records", json=[rec("quiet", namespace=NS)], headers=unsampled)
        assert response.status_code == 200, response.text
        assert exporter.get_finished_spans() == ()
    ids = [plan["trace_id"] for plan in plans]
    assert all(re.fullmatch("[0-9a-f]{32}", i) and i != "0" * 32 for i in ids), ids
    assert ids[0] != ids[1]
    assert continued["trace_id"] == caller
    *loaded, quiet = _outbox_traceparents(data_dir)  # `_load`'s one write of 5, then 1
    assert len(loaded) == 5 and len(set(loaded)) == 1
    assert not _sampled(loaded[0]) and not _sampled(quiet)
    assert loaded[0] is not None and not loaded[0].startswith(f"00-{caller}-")
    assert quiet is not None and quiet.startswith(f"00-{caller}-")
    assert not quiet.startswith(f"00-{caller}-00f067aa0ba902b7")


def test_a_callers_sampled_flag_is_honoured_whatever_the_ratio(tmp_path: Path) -> None:
    """ParentBased: at ratio 0 a caller's sampled request still has its request span and
    one span per stage, and its write carries a sampled `traceparent`; at ratio 1 a
    caller's unsampled request makes no span but keeps the caller's trace id."""
    caller = "0af7651916cd43dd8448eb211c80319c"
    sampled = {"traceparent": f"00-{caller}-b7ad6b7169203331-01"}
    query = {"namespace": NS, "scope_ref": SCOPE, "query_text": "thermos"}
    data_dir = tmp_path / "zero"
    with _stack(data_dir, tracing_sample_ratio=0.0) as (client, exporter):
        _load(client)
        assert exporter.get_finished_spans() == ()
        response = client.post("/v1/external/retrieve/topk_records", json=query, headers=sampled)
        assert response.status_code == 200, response.text
        assert response.json()["query_plan"]["trace_id"] == caller
        write = client.post("/v1/records", json=[rec("loud", namespace=NS)], headers=sampled)
        assert write.status_code == 200, write.text
        spans = exporter.get_finished_spans()
    assert {format(s.context.trace_id, "032x") for s in spans} == {caller}
    (request,) = [s for s in spans if s.name == "POST /v1/external/retrieve/topk_records"]
    assert request.parent is not None and request.parent.span_id == 0xB7AD6B7169203331
    assert sorted(s.name for s in _children(spans, request)) == sorted(
        f"query.{stage}" for stage in STAGES
    )
    (written,) = [s for s in spans if s.name == "POST /v1/records"]
    carried = _outbox_traceparents(data_dir)[-1]
    assert _sampled(carried)
    assert (
        carried == f"00-{caller}-{written.context.span_id:016x}-{written.context.trace_flags:02x}"
    )

    with _stack(tmp_path / "one", tracing_sample_ratio=1.0) as (client, exporter):
        unsampled = {"traceparent": f"00-{caller}-b7ad6b7169203331-00"}
        response = client.get("/healthz", headers=unsampled)
        assert response.status_code == 200
        assert exporter.get_finished_spans() == ()
        client.get("/healthz")
        (own,) = exporter.get_finished_spans()
        assert format(own.context.trace_id, "032x") != caller
