"""An OTLP/HTTP trace receiver on loopback, the collector's side for tests and benches
(`tests/e2e/test_otlp_export.py`, `bench/metrics_overhead.py`)."""

from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["OtlpReceiver", "Received"]


@dataclass(frozen=True)
class Received:
    """One span as the receiver decoded it (ids in lowercase hex, as in `traceparent`)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    links: tuple[tuple[str, str], ...]
    service: str
    start_ns: int = 0
    end_ns: int = 0
    attributes: tuple[tuple[str, str], ...] = ()
    error: bool = False
    trace_state: str = ""


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
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        tuple((a.key, str(_value(a.value))) for a in span.attributes),
                        span.status.code == 2,  # STATUS_CODE_ERROR
                        span.trace_state,
                    )
                    with self.lock:
                        self.spans.append(received)

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def main() -> None:
    """A receiver in a process of its own (`python -m tests.harness.otlp`, benches: its
    decoding stays out of the measured process): prints its endpoint and the number of
    spans received so far for each line read on stdin, ends with stdin."""
    import sys

    receiver = OtlpReceiver()
    print(receiver.endpoint, flush=True)
    for _ in sys.stdin:
        print(len(receiver.received()), flush=True)
    receiver.close()


if __name__ == "__main__":
    main()
