"""`orrery.http_protocol`: every response leaves in one write (its head held for the body's
first piece) and HTTP/1.1 keeps its meaning: HEAD, 204, chunked streaming, `Expect:
100-continue`, pipelining and keep-alive, over a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from orrery.http_protocol import bounded_httptools


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    else:
        answer = b"echo:" + body if body else b"hello " + path.encode()
        headers = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        _app, http=bounded_httptools(), loop="uvloop", log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=30)


def _exchange(port: int, request: bytes, *, until: bytes, pause_after: bytes = b"") -> bytes:
    """Send `request` (the part after `pause_after` only once the server answered `100
    Continue`), read until the answer holds `until`."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        received = b""
        if pause_after:
            head, rest = request.split(pause_after, 1)
            conn.sendall(head + pause_after)
            while b"100 Continue\r\n\r\n" not in received:
                received += conn.recv(65536)
            request = rest
        conn.sendall(request)
        while until not in received:
            chunk = conn.recv(65536)
            assert chunk, f"connection closed early: {received!r}"
            received += chunk
        return received


def test_a_plain_response_has_its_head_and_body(port: int) -> None:
    answer = _exchange(port, b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n", until=b"hello /x")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 8\r\n" in answer and answer.endswith(b"\r\n\r\nhello /x")


def test_head_and_204_answer_without_a_body(port: int) -> None:
    head = _exchange(port, b"HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n", until=b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    empty = _exchange(port, b"GET /empty HTTP/1.1\r\nHost: t\r\n\r\n", until=b"\r\n\r\n")
    assert empty.startswith(b"HTTP/1.1 204 No Content\r\n") and empty.endswith(b"\r\n\r\n")


def test_a_streamed_response_arrives_in_its_chunks(port: int) -> None:
    answer = _exchange(port, b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n", until=b"0\r\n\r\n")
    assert b"transfer-encoding: chunked\r\n" in answer
    assert answer.endswith(b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n")


def test_expect_100_continue_is_not_held_back(port: int) -> None:
    request = (
        b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\nbody"
    )
    answer = _exchange(port, request, until=b"echo:body", pause_after=b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert answer.endswith(b"echo:body")


def test_pipelined_requests_are_answered_in_order_on_one_connection(port: int) -> None:
    requests = b"".join(
        f"GET /{n} HTTP/1.1\r\nHost: t\r\n\r\n".encode() for n in ("a", "bb", "ccc")
    )
    answer = _exchange(port, requests, until=b"hello /ccc")
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert answer.index(b"hello /a") < answer.index(b"hello /bb") < answer.index(b"hello /ccc")


def test_a_request_leaves_no_reference_cycle_for_the_collector(port: int) -> None:
    """A request's cycle, scope and events are freed when it ends, not by the garbage
    collector: with the collector off, finished requests' cycles do not pile up (a
    strong reference from the transport back to its cycle kept every one of them, and
    collecting ~42k such objects held a 1M server's interpreter 100-230 ms)."""
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    def live_cycles() -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, RequestResponseCycle))

    gc.collect()
    gc.disable()
    try:
        before = live_cycles()
        for n in range(30):
            _exchange(port, f"GET /{n} HTTP/1.1\r\nHost: t\r\n\r\n".encode(), until=b"hello /")
        deadline = time.monotonic() + 10
        while live_cycles() - before > 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the server drops a closed connection's protocol soon after
        assert live_cycles() - before <= 2
    finally:
        gc.enable()
