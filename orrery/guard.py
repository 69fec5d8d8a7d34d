"""The request guard in front of every Orrery app: body size and content type.

A pure ASGI middleware (nothing buffered here), installed by every app factory
(`create_app`, the ingest-only app of the server deployment):

- a body over `max_body_bytes` (`ORRERY_MAX_BODY_BYTES`) is `413 body_too_large`: at once
  when `Content-Length` declares it, and for a body without one (chunked) as soon as the
  bytes received pass the limit — a route never holds more than the limit plus one chunk;
- a POST/PUT/PATCH whose `Content-Type` is present and not JSON (`application/json` or
  `…+json`) is `415 unsupported_media_type`; no `Content-Type` is read as JSON;
- a *streamed* path (`stream_paths`: `POST /v1/koutendb/import`, whose route reads its
  body line by line and never holds more than a batch) takes JSON lines as well
  (`application/x-ndjson`, `application/jsonl`, `application/x-jsonlines`) and has its
  own limit, `max_stream_bytes` (`ORRERY_MAX_IMPORT_BYTES`).

Errors leave in Orrery's shape (`contracts.errors.ErrorResponse`). The rest of a refused
body is discarded by the server (uvicorn reads and drops it to keep the connection).

The limits are one `BodyLimits` value: the guard applies it (`limit_for`) and the app's
OpenAPI document is annotated from it (`BodyLimits.document`: every POST/PUT/PATCH
operation declares its limit as `x-orrery-max-body-bytes` and its `413` names
`body_too_large` with that limit), so the document and the guard cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.errors import ErrorCode, OrreryError
from contracts.request_context import note_error

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_STREAM_BYTES",
    "JSON_LINES_TYPES",
    "MAX_BODY_BYTES_KEY",
    "RETRY_AFTER_SECONDS",
    "BodyLimits",
    "BodyTooLarge",
    "RequestGuard",
    "error_response",
    "retry_after",
]

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class BodyTooLarge(OrreryError):
    """A request body over the limit (`413 body_too_large`)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            ErrorCode.BODY_TOO_LARGE,
            f"the request body is larger than {limit} bytes (ORRERY_MAX_BODY_BYTES)",
            {"max_body_bytes": limit},
        )


DEFAULT_MAX_STREAM_BYTES = 2 * 1024 * 1024 * 1024
JSON_LINES_TYPES = frozenset(
    {"application/x-ndjson", "application/jsonl", "application/x-jsonlines"}
)


def _is_json(content_type: str, *, lines: bool = False) -> bool:
    media_type = content_type.partition(";")[0].strip().lower()
    return (
        media_type == "application/json"
        or (media_type.startswith("application/") and media_type.endswith("+json"))
        or (lines and media_type in JSON_LINES_TYPES)
    )


async def _send_error(error: OrreryError, scope: Scope, receive: Receive, send: Send) -> None:
    note_error(error.code.value)
    body = error.to_response().model_dump(mode="json")
    headers = retry_after(error.http_status)
    await JSONResponse(body, status_code=error.http_status, headers=headers)(scope, receive, send)


# The operation's extension in the OpenAPI document that states its body limit.
MAX_BODY_BYTES_KEY = "x-orrery-max-body-bytes"
_DOCUMENTED_METHODS = tuple(m.lower() for m in sorted(_BODY_METHODS))


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The request guard's body limits: `max_body_bytes` for every path, `max_stream_bytes`
    for `stream_paths` (which take JSON lines too)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    stream_paths: frozenset[str] = field(default_factory=frozenset)
    max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.max_stream_bytes < 1:
            raise ValueError("max_body_bytes and max_stream_bytes must be at least 1")

    def limit_for(self, path: str) -> int:
        """The most bytes a request body to `path` may have."""
        return self.max_stream_bytes if path in self.stream_paths else self.max_body_bytes

    def document(self, doc: dict[str, Any]) -> dict[str, Any]:
        """`doc` (an OpenAPI document whose operations declare Orrery's error responses,
        `contracts.openapi.finish_document`) with every POST/PUT/PATCH operation's body
        limit: `MAX_BODY_BYTES_KEY`, and its `413` (which must allow `body_too_large`,
        else `ValueError`) says the limit. In place; returns `doc`. The guard refuses an
        oversized body of any method, but only these methods carry one (`_BODY_METHODS`,
        the same set its media-type check covers, so their `415` is the guard's too)."""
        for path, item in doc.get("paths", {}).items():
            limit = self.limit_for(path)
            setting = (
                "ORRERY_MAX_IMPORT_BYTES" if path in self.stream_paths else "ORRERY_MAX_BODY_BYTES"
            )
            for method in _DOCUMENTED_METHODS:
                op = item.get(method)
                if op is None:
                    continue
                op[MAX_BODY_BYTES_KEY] = limit
                response = op.get("responses", {}).get("413")
                if response is None or ErrorCode.BODY_TOO_LARGE.value not in _codes(response):
                    raise ValueError(f"{method.upper()} {path} declares no 413 body_too_large")
                response["description"] = (
                    f"{response['description']}; a body over {limit} bytes ({setting}) is "
                    f"`body_too_large` with details.max_body_bytes = {limit}"
                )
        return doc


def _codes(response: dict[str, Any]) -> list[str]:
    """The error codes an error response (`contracts.openapi.error_responses`, perhaps
    beside a route's own model in `anyOf`) allows."""
    schema = response["content"]["application/json"]["schema"]
    codes: list[str] = []
    for branch in schema.get("anyOf", [schema]):
        for part in branch.get("allOf", ()):
            error = part.get("properties", {}).get("error", {})
            codes.extend(error.get("properties", {}).get("code", {}).get("enum", ()))
    return codes


class RequestGuard:
    """Refuses oversized and non-JSON bodies before any route reads them (see the module
    docstring). Guarantee: the wrapped app never receives more than `max_body_bytes` bytes
    of one request's body."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: BodyLimits | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        stream_paths: Iterable[str] = (),
        max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES,
    ) -> None:
        if limits is None:
            limits = BodyLimits(max_body_bytes, frozenset(stream_paths), max_stream_bytes)
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        content_type = headers.get("content-type")
        path = scope.get("path", "")
        streamed = path in self.limits.stream_paths
        wants_json = scope["method"] in _BODY_METHODS and content_type is not None
        if wants_json and content_type is not None and not _is_json(content_type, lines=streamed):
            error = OrreryError(
                ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                f"send the body as application/json, not {content_type[:100]!r}",
                {"content_type": content_type[:100]},
            )
            await _send_error(error, scope, receive, send)
            return
        limit = self.limits.limit_for(path)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _send_error(BodyTooLarge(limit), scope, receive, send)
            return

        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyTooLarge as exc:
            # Apps with Orrery's error handlers answer this themselves; this is for others.
            if started:
                raise
            await _send_error(exc, scope, receive, send)


# How long a client waits before it retries an answer that says "not now" (429, 503):
# one second, the pace Orrery's own backlog answer asks for. ChonkyDB's client (Twinr)
# reads the header; without it a client guesses.
RETRY_AFTER_SECONDS = 1


def retry_after(status: int, headers: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """`headers` plus `Retry-After` for a 429 or 503 that has none."""
    out = dict(headers or {})
    if status in (429, 503) and not any(k.lower() == "retry-after" for k in out):
        out["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return out or None


def error_response(exc: OrreryError) -> JSONResponse:
    """An `OrreryError` as every Orrery app answers it: the error body, the error's own
    headers (`ingest_backlog`: its Retry-After) plus `retry_after`'s, and the code noted
    for the request's telemetry (`contracts.request_context.note_error`)."""
    dependency = exc.details.get("dependency") if exc.details else None
    note_error(exc.code.value, dependency if isinstance(dependency, str) else None)
    headers: Mapping[str, str] | None = getattr(exc, "headers", None)
    return JSONResponse(
        exc.to_response().model_dump(mode="json"),
        status_code=exc.http_status,
        headers=retry_after(exc.http_status, headers),
    )
