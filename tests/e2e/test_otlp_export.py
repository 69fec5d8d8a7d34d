"""`orrery serve` exporting its spans over OTLP/HTTP (the `otlp` extra) to a receiver on
loopback: the spans of one write and one query arrive with the right ids."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.e2e.conftest import start_server
from tests.e2e.test_embedded_http import rec

NS = "otlp_ns"
STAGES = ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize")


@dataclass(frozen=True)
class Received:
    """One span as the receiver decoded it (ids in lowercase hex, as in `traceparent`)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    links: tuple[tuple[str, str], ...]
    service: str


class OtlpReceiver:
    """The collector's side of OTLP/HTTP for traces on 127.0.0.1: decodes each protobuf
    `ExportTraceServiceRequest` POSTed to /v1/traces (with the opentelemetry-proto
    package), keeps its spans, answers an empty `ExportTraceServiceResponse`."""

    def __init__(self) -> None:
        receiver = self
        self.spans: list[Received] = []
        self.lock = threading.Lock()
        answer = ExportTraceServiceResponse().SerializeToString()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/v1/traces" or (
                    self.headers["Content-Type"] != "application/x-protobuf"
                ):
                    self.send_error(404 if self.path != "/v1/traces" else 415)
                    return
                receiver.take(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received = Received(
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        span.name,
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        attributes.get("service.name", ""),
                    )
                    with self.lock:
                        self.spans.append(received)

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


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
