"""Bounded memory per request (issue 22), measured on a real `orrery serve` process.

Each case sends one request at (or past) a documented limit and reads the server's RSS
from `/proc/<pid>/status` before and after: no single request may grow it by more than
`RSS_BOUND`. Past a limit the answer is a 4xx with a machine-readable code. The same
table runs against both deployments whose stores differ: embedded (SQLite) and server
mode (PostgreSQL, Kafka, OpenSearch, Qdrant; marked `servers`).

What failed before (the probe's figures): a 256 MiB header to `/healthz` answered 200
and grew the server by 507 MiB; 60 import lines of 15 MB, +2,977 MiB; `by_id` with 40
ids, a 629 MB answer and +1,547 MiB; `allowed_doc_ids` with 40 ids read every record in
full to learn its kind, +621 MiB.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import DEPLOYMENTS
from tests.e2e.test_servers_http import server_env

pytestmark = [pytest.mark.slow]

MiB = 1024 * 1024
RSS_BOUND = 200 * MiB
NS = "mem"
TOPK = "/v1/external/retrieve/topk_records"
# Just within the default ORRERY_MAX_RECORD_BYTES (4 MiB of stored JSON).
BIG_TEXT_CHARS = 3 * MiB


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Grown:
    """RSS growth of the server over a block (`with Grown(srv) as grown: ...`)."""

    def __init__(self, srv: Server) -> None:
        self.pid = srv.process.pid
        self.bytes = 0

    def __enter__(self) -> Grown:
        self.start = rss_bytes(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.bytes = rss_bytes(self.pid) - self.start

    def check(self, what: str) -> None:
        assert self.bytes <= RSS_BOUND, f"{what}: RSS grew by {self.bytes / MiB:.0f} MiB"


def raw_request(srv: Server, head: bytes, *, stream_bytes: int = 0) -> bytes:
    """Send `head` (plus `stream_bytes` more header bytes, 1 MiB at a time, as long as
    the server reads them) on a socket of its own; the server's answer."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as sock:
        try:
            sock.sendall(head)
            chunk = b"a" * MiB
            for _ in range(stream_bytes // MiB):
                sock.sendall(chunk)
        except OSError:
            pass  # the server refused and closed: read what it answered
        answer = b""
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except OSError:
            pass
        return answer


def status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    env: dict[str, str] = {}
    if request.param == "servers":
        env.update(server_env(run_tag()))
    server = start_server(tmp_path_factory.mktemp("memory") / "data", env=env)
    yield server
    server.stop()


def test_a_huge_header_is_431_and_the_server_does_not_grow(srv: Server) -> None:
    """256 MiB of one header line to `/healthz` (no key needed) once answered 200 and
    grew the server by 507 MiB."""
    with Grown(srv) as grown:
        answer = raw_request(
            srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ", stream_bytes=256 * MiB
        )
    grown.check("256 MiB header")
    if answer:  # the refusal may be lost to the reset of a socket still sending
        status, body = status_and_body(answer)
        assert (status, body["error"]["code"]) == (431, "headers_too_large")
    # Just past the limit, read whole: the 431 in Orrery's shape.
    status, body = status_and_body(
        raw_request(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000)
    )
    assert (status, body["error"]["code"]) == (431, "headers_too_large")
    assert body["error"]["details"] == {"max_header_bytes": 64 * 1024}
    assert srv.client.get("/healthz").status_code == 200


def test_too_many_headers_is_431(srv: Server) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-H%d: v\r\n" % i for i in range(150)
    )
    status, body = status_and_body(raw_request(srv, head + b"\r\n"))
    assert (status, body["error"]["code"]) == (431, "headers_too_large")
    assert body["error"]["details"] == {"max_headers": 100}
    # Within both limits: answered as usual, on a connection kept alive.
    ok = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + b"".join(
        b"X-H%d: %s\r\n" % (i, b"v" * 500) for i in range(90)
    )
    status, body = status_and_body(raw_request(srv, ok + b"\r\n"))
    assert (status, body) == (200, {"status": "ok"})
