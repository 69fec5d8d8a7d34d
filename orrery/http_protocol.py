"""The HTTP/1.1 protocol `orrery serve` runs: uvicorn's httptools protocol with a bound
on each request's head (request line and headers).

uvicorn bounds an incomplete head only for h11 (`h11_max_incomplete_event_size`); with
httptools the parser buffers a header until it ends, and uvicorn appends the URL piece
by piece, so one request with a 256 MiB header grew the server by 507 MiB and was
answered 200 (issue 22). Here the bytes a connection sends before its head is complete
are counted as they arrive, and a head past `max_head_bytes` is answered `431
headers_too_large` (Orrery's error shape, `Connection: close`) without being fed to the
parser; so is a head with more than `max_headers` header lines. Body bytes that arrive
in the same read as the end of the head are not counted against the head.

Each response also leaves in one write (`_OneWrite`): uvicorn writes a response's status
line and headers, then its body, as two sends on the socket, and on this machine each
send over loopback cost ~0.4 ms of the event loop's thread (py-spy, SciFact one-shot:
31 % of that thread's busy samples were these two writes) and woke the client twice.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from contracts.errors import ErrorCode, OrreryError

__all__ = ["DEFAULT_MAX_HEADERS", "DEFAULT_MAX_HEAD_BYTES", "bounded_httptools"]

DEFAULT_MAX_HEAD_BYTES = 64 * 1024
DEFAULT_MAX_HEADERS = 100


class _OneWrite:
    """The transport one request's cycle writes through: the response head (the first
    write after the response started) is held and goes out with the next write, the
    body's first piece, as one send. Every other write and call passes straight through;
    `close` sends a held head first. A write before the response started (`100
    Continue`) is never held.

    The cycle is held by a weak reference: the cycle holds this transport, and a strong
    reference back made every request's cycle, scope and events a reference cycle that
    only the garbage collector freed — at ~100 requests a second a young-generation
    collection of ~42k such objects every ~40 s, which held the interpreter 100-230 ms
    beside a 1M generation's re-check (session 34)."""

    __slots__ = ("_cycle", "_head_seen", "_held", "_transport")

    def __init__(self, transport: Any, cycle: Any) -> None:
        self._transport = transport
        self._cycle = weakref.ref(cycle)
        self._held: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif not self._head_seen and getattr(self._cycle(), "response_started", False):
            self._head_seen = True
            self._held = bytes(data)
        else:
            self._transport.write(data)

    def close(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _TooManyHeaders(Exception):
    """Raised from the parser's header callback: stops the parse (httptools wraps it)."""


def _refusal(error: OrreryError) -> bytes:
    body = json.dumps(error.to_response().model_dump(mode="json")).encode()
    return (
        f"HTTP/1.1 {error.http_status} Request Header Fields Too Large\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


def bounded_httptools(
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES, max_headers: int = DEFAULT_MAX_HEADERS
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol class (`uvicorn.Config(http=...)`) refusing a request
    head over `max_head_bytes` or with more than `max_headers` headers (`431`).

    Guarantee: a connection never holds more than `max_head_bytes` of an incomplete head
    (plus one read of the socket, which is refused, not parsed)."""
    if max_head_bytes < 1_024 or max_headers < 1:
        raise ValueError("max_head_bytes must be at least 1024 and max_headers at least 1")
    too_large = _refusal(
        OrreryError(
            ErrorCode.HEADERS_TOO_LARGE,
            f"the request line and headers are larger than {max_head_bytes} bytes "
            "(ORRERY_MAX_HEADER_BYTES)",
            {"max_header_bytes": max_head_bytes},
        )
    )
    too_many = _refusal(
        OrreryError(
            ErrorCode.HEADERS_TOO_LARGE,
            f"the request has more than {max_headers} headers (ORRERY_MAX_HEADERS)",
            {"max_headers": max_headers},
        )
    )

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = True
            self._head_bytes = 0
            self._header_count = 0
            self._refused = False

        def _refuse(self, answer: bytes) -> None:
            self._refused = True
            if not self.transport.is_closing():
                self.transport.write(answer)
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            if not self._refused:  # else the 431 went out and the connection is closed
                super().send_400_response(msg)

        def on_message_begin(self) -> None:
            self._header_count = 0
            super().on_message_begin()

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            if self._header_count > max_headers:
                self._refuse(too_many)
                raise _TooManyHeaders
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            before = self.cycle
            super().on_headers_complete()
            cycle = self.cycle
            # Only the cycle this request just got (an upgrade gets none); a HEAD
            # response has no body write to carry its head: sent as it comes.
            if cycle is not None and cycle is not before and cycle.scope["method"] != "HEAD":
                cycle.transport = cast(asyncio.Transport, _OneWrite(cycle.transport, cycle))

        def on_message_complete(self) -> None:
            # The next bytes on this connection are the next request's head.
            self._in_head = True
            self._head_bytes = 0
            super().on_message_complete()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if not self._in_head:
                super().data_received(data)
                return
            room = max_head_bytes - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                super().data_received(data)
                return
            # Feed only what fits; if the head ends within it, the rest is body (or the
            # next request, counted afresh).
            self._head_bytes = max_head_bytes
            super().data_received(data[:room])
            if self._refused or self.transport.is_closing():
                return
            if self._in_head:
                self._refuse(too_large)
                return
            self.data_received(data[room:])

    return BoundedHttpToolsProtocol
