"""What a log line, a metric and a span know about the request being served.

The HTTP middleware of every app (`orrery.telemetry`) opens one `RequestContext` per
request; code below it (on the event loop, or on a worker thread running a copy of the
context, as `run_in_threadpool` and the query offload do) adds what it learns — the
namespace the request names, the error code it fails with — through `note_namespace`
and `note_error`. The object is shared, not copied, so what a worker thread notes is
seen by the middleware when the response leaves. Outside a request every call is a
no-op costing one context-variable read. Stdlib only, no I/O.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "RequestContext",
    "close_request",
    "current",
    "current_traceparent",
    "note_error",
    "note_namespace",
    "open_request",
]


@dataclass(slots=True)
class RequestContext:
    """One request's identity (`request_id`, the trace it belongs to when tracing is on)
    and what was learnt while serving it."""

    request_id: str
    trace_id: str | None = None
    # The request span as a W3C `traceparent` (tracing on): what a write carries along
    # through the outbox and the log, so the projector's batch span links to it.
    traceparent: str | None = None
    namespace: str | None = None
    error_code: str | None = None
    # The dependency (engine, store, broker) an error came from, when one did.
    dependency: str | None = None


_CURRENT: ContextVar[RequestContext | None] = ContextVar("orrery_request", default=None)


def open_request(context: RequestContext) -> object:
    """Make `context` the current request's; returns the token `close_request` takes."""
    return _CURRENT.set(context)


def close_request(token: object) -> None:
    _CURRENT.reset(token)  # type: ignore[arg-type]


def current() -> RequestContext | None:
    """The request being served here, or None outside one."""
    return _CURRENT.get()


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the request being served, when it is traced."""
    context = _CURRENT.get()
    return None if context is None else context.traceparent


def note_namespace(namespace: str) -> None:
    """Record the namespace the current request names (first one wins)."""
    context = _CURRENT.get()
    if context is not None and context.namespace is None:
        context.namespace = namespace


def note_error(code: str, dependency: str | None = None) -> None:
    """Record the error code the current request fails with (the last one wins: it is
    the one answered)."""
    context = _CURRENT.get()
    if context is not None:
        context.error_code = code
        context.dependency = dependency
