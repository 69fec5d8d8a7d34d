"""`orrery serve` exporting its spans over OTLP/HTTP (the `otlp` extra) to a receiver on
loopback: the spans of one write and one query arrive with the right ids."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.conftest import start_server
from tests.e2e.test_embedded_http import rec
from tests.harness.otlp import OtlpReceiver

NS = "otlp_ns"
STAGES = ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize")


def test_a_write_and_a_query_reach_an_otlp_receiver_with_their_trace_ids(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    srv = start_server(
        tmp_path / "data",
        env={
            "ORRERY_TRACING": "true",
            "ORRERY_OTLP_ENDPOINT": receiver.endpoint,
            "ORRERY_TRACING_SAMPLE_RATIO": None,  # the default, 1.0
        },
    )
    try:
        caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        write = srv.client.post(
            "/v1/records",
            json=[rec("exported", namespace=NS, title="exported thermos")],
            headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
        )
        assert write.status_code == 200, write.text
        srv.wait_projected(timeout=120)
        query = srv.topk(namespace=NS, scope_ref="longterm:objects:current", query_text="thermos")
        assert query.status_code == 200, query.text
        query_trace = query.json()["query_plan"]["trace_id"]
        assert query_trace != caller_trace

        # The batch processor exports every few seconds: poll (generously, under load).
        deadline = time.monotonic() + 120
        while True:
            spans = receiver.received()
            writes = [s for s in spans if s.name == "POST /v1/records"]
            batches = [
                s
                for s in spans
                if s.name == "projector.batch"
                and any((caller_trace, w.span_id) in s.links for w in writes)
            ]
            queried = [s for s in spans if s.trace_id == query_trace]
            if writes and batches and len(queried) == 1 + len(STAGES):
                break
            assert time.monotonic() < deadline, sorted((s.name, s.trace_id) for s in spans)
            time.sleep(0.2)
        # The spans were made and exported by the exporter child: readiness says so.
        readiness = srv.client.get("/v1/readiness").json()
        assert readiness["tracing"] == {
            "exporter": "child",
            "dropped": 0,
            "restarts": 0,
            "pending": 0,
            "export_failed": 0,
        }
        assert readiness["ready"] is True
    finally:
        srv.stop()

    (written,) = writes
    assert (written.trace_id, written.parent_span_id) == (caller_trace, caller_span)
    assert written.service == "orrery"
    (request,) = [s for s in queried if s.name == "POST /v1/external/retrieve/topk_records"]
    assert request.parent_span_id == ""
    stages = [s for s in queried if s is not request]
    assert sorted(s.name for s in stages) == sorted(f"query.{stage}" for stage in STAGES)
    assert {s.parent_span_id for s in stages} == {request.span_id}
