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

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

from contracts.request_context import current

__all__ = ["JsonFormatter", "RequestContextFilter", "TextFormatter", "configure_logging"]

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
