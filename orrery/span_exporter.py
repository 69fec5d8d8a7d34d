"""The exporter child: spans made and exported over OTLP/HTTP in a process of their own.

The serving process's request threads only queue one compact tuple per sampled request
(`orrery.tracing.Tracing.end_request`). Making the SDK spans from it and exporting them
cost ~0.6 ms of Python per request, and on the serving interpreter that time held the
GIL the request threads wait for (+14 % at p50 at ratio 1.0). Here a shipper thread of
the serving process wakes at most once per `batch_seconds` (200 ms), pickles what was
queued meanwhile as one list and writes it to the child's stdin in one frame; the child
(`python -m orrery.span_exporter`) makes the spans with exactly the recorded ids and
times (`orrery.tracing.SpanMaker`) and exports them itself, 512 spans or 1 s at most
after the first waiting (a slow collector blocks it rather than losing spans).

Nothing is lost silently:
- at most `max_pending` items wait for the child; more are dropped and counted
  (`dropped`: readiness `tracing`, `orrery_trace_dropped_total`), as is a batch whose
  write fails because the child died;
- a child's death is noticed within `health_seconds` (or at the next write) and counted
  (`restarts`); the child is restarted after a backoff (0.5 s doubling to 60 s, reset by
  a child that lived a minute); meanwhile items wait in the bounded queue. What a dead
  child had received but not exported yet is lost with it (counted as its restart,
  not per span);
- `flush` waits until the child has exported everything queued before it; `close`
  ships what is queued, then the child exports what it holds and exits.

Frames on the child's stdin: a 4-byte big-endian length, then a pickle: a list of items,
or ("flush",) (the child answers one byte on its stdout: b"1" exported, b"0" not), or
("stop",). The child ends when its stdin ends (the serving process is gone).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

__all__ = ["ExporterChild", "main", "otlp_exporter"]

_log = logging.getLogger("orrery.tracing")
_HEADER = struct.Struct("!I")
_COUNT = struct.Struct("!Q")
# The directory holding the `orrery` package: the child imports it from there.
_ROOT = str(Path(__file__).resolve().parent.parent)


def otlp_exporter(endpoint: str) -> Any:
    """The OTLP/HTTP span exporter (the `otlp` extra), or `ValueError` naming the extra."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError as exc:
        raise ValueError(
            "ORRERY_OTLP_ENDPOINT is set but the OTLP exporter is not installed: "
            "pip install 'orrery[otlp]'"
        ) from exc
    return OTLPSpanExporter(endpoint=endpoint)


class _Flush:
    """A flush marker in the queue: set once the child answered (`ok`: it exported)."""

    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False


class ExporterChild:
    """The serving process's side of the exporter child (module docstring). `put` runs
    on request threads: a length check and a deque append; everything else runs on the
    shipper thread (started with the first item) and in the child."""

    def __init__(
        self,
        endpoint: str,
        *,
        resource_attributes: dict[str, str],
        sample_ratio: float,
        max_pending: int = 10_000,
        batch_seconds: float = 0.2,
        health_seconds: float = 5.0,
    ) -> None:
        self.config = json.dumps(
            {"endpoint": endpoint, "resource": resource_attributes, "sample_ratio": sample_ratio}
        )
        self.max_pending = max_pending
        self.batch_seconds = batch_seconds
        self.health_seconds = health_seconds
        self._pending: deque[Any] = deque()
        self._wake = threading.Event()
        self._now = threading.Event()
        self._idle = True
        self._stopping = False
        self._closed = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._dropped = 0
        self._export_failed = 0
        self._restarts = 0
        self._failures = 0
        self._started_at = 0.0
        self._down_until = 0.0
        self._check_at = 0.0

    # --- request threads ---------------------------------------------------------------

    def put(self, item: tuple[Any, ...]) -> None:
        """Queue one item for the child, or drop and count it (queue full, or closed)."""
        if len(self._pending) >= self.max_pending or self._closed:
            self._drop(1)
            return
        self._pending.append(item)
        if self._thread is None:
            self._start()
        elif self._idle:
            self._wake.set()

    def _drop(self, n: int) -> None:
        with self._lock:
            self._dropped += n

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                thread = threading.Thread(target=self._run, name="orrery-span-shipper", daemon=True)
                thread.start()
                self._thread = thread

    # --- any thread ----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return None if proc is None else proc.pid

    def status(self) -> dict[str, Any]:
        """`exporter`: `child` (running), `restarting` (died, not restarted yet), `idle`
        (no span yet), `closed`; `dropped`, `restarts`, `pending` (items queued)."""
        proc = self._proc
        if self._closed:
            state = "closed"
        elif proc is not None and proc.poll() is None:
            state = "child"
        elif proc is None and self._restarts == 0:
            state = "idle"
        else:
            state = "restarting"
        with self._lock:
            dropped, restarts, failed = self._dropped, self._restarts, self._export_failed
        return {
            "exporter": state,
            "dropped": dropped,
            "restarts": restarts,
            "pending": len(self._pending),
            "export_failed": failed,
        }

    def flush(self, timeout: float) -> bool:
        """Wait until every item queued before this call was exported by the child
        (True), or `timeout` seconds pass or the child failed (False)."""
        if self._thread is None:
            return True
        marker = _Flush()
        self._pending.append(marker)
        self._now.set()
        self._wake.set()
        return marker.done.wait(timeout) and marker.ok

    def close(self, timeout: float = 60.0) -> None:
        """Ship what is queued, let the child export it and exit; later items are
        dropped and counted. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._now.set()
        self._wake.set()
        thread.join(timeout)

    # --- the shipper thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._idle = True
            if not self._pending and not self._stopping:
                self._wake.wait(self.health_seconds)
            self._idle = False
            self._wake.clear()
            if not self._stopping:
                # Gather a batch: one write per `batch_seconds` at most, however many
                # requests arrive meanwhile.
                self._now.wait(self.batch_seconds)
                self._now.clear()
            if self._pending:
                self._ship()
            if (self._proc is not None or self._restarts) and time.monotonic() >= self._check_at:
                # A health check: a dead child is noticed and restarted; a live one says
                # how many spans its exporter could not deliver.
                self._check_at = time.monotonic() + self.health_seconds
                if self._child() is not None:
                    self._exchange_flush()
            if self._stopping and (not self._pending or self._child() is None):
                break
        self._stop_child()
        if self._pending:
            self._drop(sum(1 for item in self._pending if not isinstance(item, _Flush)))
            self._pending.clear()

    def _ship(self) -> None:
        if self._child() is None:
            return  # down: the items wait (bounded) for the restart
        batch: list[Any] = []
        while self._pending:
            item = self._pending.popleft()
            if isinstance(item, _Flush):
                self._send_batch(batch)
                batch = []
                item.ok = self._exchange_flush()
                item.done.set()
            else:
                batch.append(item)
        self._send_batch(batch)

    def _send_batch(self, batch: list[Any]) -> None:
        if batch and not self._write(pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)):
            self._drop(len(batch))

    def _write(self, payload: bytes) -> bool:
        proc = self._child()
        if proc is None or proc.stdin is None:
            return False
        try:
            proc.stdin.write(_HEADER.pack(len(payload)) + payload)
            proc.stdin.flush()
        except OSError:  # a broken pipe: the child died
            self._died(proc)
            return False
        return True

    def _exchange_flush(self) -> bool:
        proc = self._child()
        if proc is None or proc.stdout is None or not self._write(pickle.dumps(("flush",))):
            return False
        answer = b""
        deadline = time.monotonic() + 120.0
        while len(answer) < 1 + _COUNT.size:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([proc.stdout], [], [], wait)[0]:
                return False  # a child this slow is not ended: its export may be stuck
            chunk = os.read(proc.stdout.fileno(), 1 + _COUNT.size - len(answer))
            if not chunk:
                self._died(proc)
                return False
            answer += chunk
        with self._lock:
            self._export_failed = _COUNT.unpack_from(answer, 1)[0]
        return answer[:1] == b"1"

    def _child(self) -> subprocess.Popen[bytes] | None:
        """The running child (started or restarted when due), or None while it is down."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                return proc
            self._died(proc)
        if time.monotonic() < self._down_until:
            return None
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "orrery.span_exporter", self.config],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
        except OSError:
            _log.exception("span exporter child not started")
            self._backoff()
            return None
        self._proc, self._started_at = proc, time.monotonic()
        return proc

    def _died(self, proc: subprocess.Popen[bytes]) -> None:
        if self._proc is not proc:
            return
        self._proc = None
        if proc.poll() is None:  # a broken pipe from a child still running: end it
            proc.kill()
        code = proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with self._lock:
            self._restarts += 1
        if time.monotonic() - self._started_at > 60.0:
            self._failures = 0
        delay = self._backoff()
        _log.error(
            "span exporter child %d exited (%s); restarting in %.1f s", proc.pid, code, delay
        )

    def _backoff(self) -> float:
        delay = min(60.0, 0.5 * 2.0**self._failures)
        self._failures += 1
        self._down_until = time.monotonic() + delay
        return delay

    def _stop_child(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        try:
            if proc.stdin is not None:
                payload = pickle.dumps(("stop",))
                proc.stdin.write(_HEADER.pack(len(payload)) + payload)
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _log.error("span exporter child %d did not stop; killed", proc.pid)
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# --- the child ---------------------------------------------------------------------------


# The child exports what it made once a second at most, or at once 512 spans at a time.
_EXPORT_SECONDS = 1.0
_EXPORT_BATCH = 512


class _Frames:
    """Length-prefixed frames from a file descriptor (raw reads: `select` sees every
    byte not yet taken)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()

    def next(self, timeout: float | None) -> bytes | None:
        """The next frame's payload; None when `timeout` passed first; EOFError at the
        end of the stream."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if len(self.buffer) >= _HEADER.size:
                size = _HEADER.unpack_from(self.buffer)[0]
                if len(self.buffer) >= _HEADER.size + size:
                    payload = bytes(self.buffer[_HEADER.size : _HEADER.size + size])
                    del self.buffer[: _HEADER.size + size]
                    return payload
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.fd], [], [], wait)[0]:
                return None
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise EOFError
            self.buffer += chunk


def _exporting_processor(exporter: Any) -> Any:
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExportResult

    class Exporting(SpanProcessor):
        """Keeps the ended spans; `export` hands them to the exporter on this thread,
        512 at a time. While the collector is slow the child blocks (its pipe fills,
        the serving process's bounded queue drops and counts) instead of dropping spans
        in a queue of its own, as the SDK's batch processor would. `failed`: spans the
        exporter did not deliver (after its own retries)."""

        def __init__(self) -> None:
            self.spans: list[ReadableSpan] = []
            self.oldest = 0.0
            self.failed = 0

        def on_end(self, span: ReadableSpan) -> None:
            if not self.spans:
                self.oldest = time.monotonic()
            self.spans.append(span)

        def export(self) -> None:
            while self.spans:
                batch = self.spans[:_EXPORT_BATCH]
                del self.spans[:_EXPORT_BATCH]
                try:
                    result = exporter.export(batch)
                except Exception:
                    _log.exception("spans not exported")
                    result = None
                if result is not SpanExportResult.SUCCESS:
                    self.failed += len(batch)

        def shutdown(self) -> None:
            self.export()
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            failed = self.failed
            self.export()
            return self.failed == failed

    return Exporting()


def main(argv: list[str] | None = None) -> int:
    """The child: reads frames from stdin until ("stop",) or the end of stdin; makes
    the spans of each batch, exports them within `_EXPORT_SECONDS`; answers each flush
    with one byte (b"1": everything exported) and the count of spans not delivered."""
    from opentelemetry.sdk.resources import Resource

    from orrery.tracing import SpanMaker, head_sampler, tracer_provider

    # The serving process decides when this one stops (a terminal's Ctrl-C reaches both).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = json.loads((argv if argv is not None else sys.argv[1:])[0])
    # Stdout carries the flush answers only: anything printed goes to stderr.
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    provider = tracer_provider(
        head_sampler(float(config["sample_ratio"])), Resource.create(config["resource"])
    )
    processor = _exporting_processor(otlp_exporter(config["endpoint"]))
    provider.add_span_processor(processor)
    maker = SpanMaker(provider)
    frames = _Frames(sys.stdin.fileno())
    try:
        while True:
            timeout = None
            if processor.spans:
                timeout = max(0.0, processor.oldest + _EXPORT_SECONDS - time.monotonic())
            try:
                payload = frames.next(timeout)
            except EOFError:
                break  # the serving process is gone
            if payload is None:
                processor.export()
                continue
            message = pickle.loads(payload)
            if isinstance(message, list):
                for item in message:
                    try:
                        maker.make(item)
                    except Exception:  # one bad item must not end the child
                        _log.exception("span not made")
                if len(processor.spans) >= _EXPORT_BATCH:
                    processor.export()
            elif message[0] == "flush":
                ok = processor.force_flush()
                answers.write((b"1" if ok else b"0") + _COUNT.pack(processor.failed))
            elif message[0] == "stop":
                break
    finally:
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
