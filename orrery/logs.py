"""Logging of the long-running commands: JSON lines for machines, text for a terminal.

`configure_logging(format, level, role)`: `json` writes one JSON object per line on
stderr — `ts`, `level`, `logger`, `msg`, `role`, and, inside a request, `request_id`,
`trace_id` (tracing on) and `namespace` (once the request named one), plus a request's
access fields under `http` (`orrery.telemetry.RequestTelemetry`) and `exc` for a
traceback; `text` writes the same facts as one readable line; `auto` (the default) is
text when stderr is a terminal, JSON otherwise (a container, a service manager).

What is logged above DEBUG never holds a record's payload or a query's text: the access
line names the route and path, never the body or the query string.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any, Literal

from contracts.request_context import current

__all__ = [
    "AccessLog",
    "JsonFormatter",
    "RequestContextFilter",
    "TextFormatter",
    "configure_logging",
]

LogFormat = Literal["auto", "json", "text"]

# Attributes every LogRecord has: what is not among them came in through `extra`.
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "role", "request_id", "trace_id", "namespace", "taskName"}
)


class RequestContextFilter(logging.Filter):
    """Stamps each record with the process's `role` and the current request's ids (from
    `contracts.request_context`), unless the record brought its own through `extra`."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        if not hasattr(record, "request_id"):
            context = current()
            record.request_id = None if context is None else context.request_id
            record.trace_id = None if context is None else context.trace_id
            record.namespace = None if context is None else context.namespace
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per record (keys in the module docstring); None values left out."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "role": getattr(record, "role", None),
            "request_id": getattr(record, "request_id", None),
            "trace_id": getattr(record, "trace_id", None),
            "namespace": getattr(record, "namespace", None),
        }
        body.update(_extras(record))
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(
            {k: v for k, v in body.items() if v is not None}, default=str, ensure_ascii=False
        )


class TextFormatter(logging.Formatter):
    """`time LEVEL logger message [request_id=… namespace=…]` for a person at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = [
            f"{key}={value}"
            for key in ("request_id", "trace_id", "namespace")
            if (value := getattr(record, key, None)) is not None
        ]
        return f"{line} [{' '.join(ids)}]" if ids else line


def configure_logging(fmt: LogFormat = "auto", level: str = "INFO", role: str = "serve") -> None:
    """Replace the root logger's handlers with one stderr handler in `fmt`."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    handler.addFilter(RequestContextFilter(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class AccessLog:
    """The access lines of one app, made and written off the request's thread.

    `line(...)` only queues a tuple (a `queue.SimpleQueue` put); a daemon thread makes
    the `LogRecord` (its `created` the request's end, its ids the request's, passed in:
    the thread has no request context) and hands it to `logger`'s handlers. Guarantees:
    lines leave in the order they were queued; `close()` (and interpreter exit) writes
    every line queued before it."""

    _STOP = object()

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def line(
        self,
        method: str,
        path: str,
        route: str,
        status: int,
        seconds: float,
        ids: tuple[str, str | None, str | None],
        error_code: str | None,
    ) -> None:
        """Queue one access line (`ids`: request id, trace id, namespace)."""
        if self._thread is None:
            self._start()
        self._queue.put((time.time(), method, path, route, status, seconds, ids, error_code))

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._write, name="orrery-access-log")
                thread.daemon = True
                thread.start()
                atexit.register(self.close)
                self._thread = thread

    def _write(self) -> None:
        logger = self.logger
        while True:
            item = self._queue.get()
            if item is self._STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            created, method, path, route, status, seconds, ids, error_code = item
            request_id, trace_id, namespace = ids
            ms = seconds * 1000.0
            # makeRecord + handle: what `info` does, minus the caller lookup (a walk of
            # the stack per line; the access line's origin is always this one).
            record = logger.makeRecord(
                logger.name, logging.INFO, __file__, 0, "%s %s %d %.1fms",
                (method, path, status, ms), None,
                extra={
                    "request_id": request_id, "trace_id": trace_id, "namespace": namespace,
                    "http": {"method": method, "route": route, "path": path,
                             "status": status, "duration_ms": round(ms, 3),
                             "error_code": error_code},
                },
            )  # fmt: skip
            record.created = created
            record.msecs = (created - int(created)) * 1000.0
            try:
                logger.handle(record)
            except Exception:  # a handler's failure must not end the writer
                logging.getLogger("orrery").exception("access log line not written")

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every line queued before this call is written (True) or `timeout`
        seconds pass (False)."""
        if self._thread is None:
            return True
        written = threading.Event()
        self._queue.put(written)
        return written.wait(timeout)

    def close(self) -> None:
        """Write every queued line, then stop the writer (idempotent)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(self._STOP)
            thread.join(timeout=10)
