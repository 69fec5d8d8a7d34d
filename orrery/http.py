"""The HTTP app every deployment serves: `build_app(title, routers, …)`.

One place for what is the app's and no package's: the error shape of every failure
(`install_error_handlers`), the body limit and content-type check (`orrery.guard`), the
OpenAPI document (`contracts.openapi`), `/healthz`. Each package contributes a router —
query (`query.entrypoints.http`), ingest (`ingest.entrypoints.http`), the generation
admin API (`projector.entrypoints.admin_http`) — and the composition roots
(`orrery.embedded`, `orrery.servers`) decide which ones a process mounts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.auth import Access, declare
from contracts.errors import HTTP_STATUS, ErrorBody, ErrorCode, ErrorResponse, OrreryError
from contracts.openapi import finish_document, operation
from contracts.ops import HealthResponse
from contracts.pacing import Activity
from contracts.request_context import note_error
from orrery.guard import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_STREAM_BYTES,
    BodyLimits,
    RequestGuard,
    error_response,
    retry_after,
)
from orrery.lean import LeanRoutes, lean_endpoints
from orrery.telemetry import Observability, RequestTelemetry, metrics_router
from orrery.ui import create_docs_router
from query.entrypoints.http import LEAN_ROUTES

__all__ = [
    "allowed_methods",
    "build_app",
    "install_error_handlers",
    "install_openapi",
    "install_request_guard",
]

log = logging.getLogger("orrery.http")

_NO_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
}


# The header every route reads an API key from.
API_KEY_HEADER = "x-api-key"


def build_app(
    title: str,
    routers: Sequence[APIRouter],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    stream_paths: Sequence[str] = (),
    max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES,
    api_key_header: str = API_KEY_HEADER,
    document_facts: dict[str, Any] | None = None,
    observability: Observability | None = None,
    activity: Activity | None = None,
) -> FastAPI:
    """An app with Orrery's error shape, request guard and OpenAPI document (with the
    deployment's `document_facts`, `contracts.openapi.DEPLOYMENT`), `/healthz`, and
    `routers` mounted in order; API keys read from `api_key_header` (and
    `Authorization: Bearer`); the one-shot query routes among them
    (`query.entrypoints.http.LEAN_ROUTES`) are answered by `orrery.lean.LeanRoutes`,
    inside the request guard and every middleware added later; with `activity`, every
    request but the `stream_paths`' counted in flight (`CountsRequests`: background scans
    yield to them); with `observability`, the request telemetry around it all (ids,
    metrics, spans, access log) and `GET /metrics` when metrics are on."""
    # FastAPI's native OpenTelemetry bridge looks the global providers up on every
    # request; Orrery configures none, so it would only ever find them unconfigured.
    # /docs and /redoc from bundled files (`orrery.ui`), not FastAPI's CDN pages.
    app = FastAPI(
        title=title, version="0.1.0", telemetry=_NO_TELEMETRY, docs_url=None, redoc_url=None
    )
    install_error_handlers(app)
    # Filled once the routers are mounted (below); the middleware stack is built at the
    # first request. Added first, so it is the innermost middleware.
    lean: dict[tuple[str, str], Any] = {}
    app.add_middleware(LeanRoutes, endpoints=lean)
    limits = install_request_guard(app, max_body_bytes=max_body_bytes,
                                   stream_paths=stream_paths,
                                   max_stream_bytes=max_stream_bytes)  # fmt: skip
    install_openapi(app, document_facts, body_limits=limits)
    if api_key_header.lower() != API_KEY_HEADER:
        app.add_middleware(ApiKeyHeader, header=api_key_header)
    if activity is not None:
        app.add_middleware(CountsRequests, activity=activity, skip=frozenset(stream_paths))
    if observability is not None:
        # Added last: the outermost middleware, so it sees the guard's refusals too.
        app.add_middleware(RequestTelemetry, observability=observability)
        if observability.metrics is not None:
            app.include_router(
                metrics_router(
                    observability.metrics,
                    admin_key=observability.admin_key,
                    open_=observability.open,
                )
            )

    @app.get(
        "/healthz",
        tags=["ops"],
        response_model=None,
        openapi_extra={**declare(Access.PUBLIC), **operation(ok=HealthResponse)},
    )
    async def get_healthz() -> dict[str, str]:
        return {"status": "ok"}

    for router in routers:
        app.include_router(router)
    app.include_router(create_docs_router())
    lean.update(lean_endpoints(routers, LEAN_ROUTES))
    # The liveness probe (and the benches' HTTP floor) through the lane too: the same
    # bytes the route above sends, without FastAPI's routing (~0.23 ms in process).
    lean[("GET", "/healthz")] = _healthz
    return app


_HEALTHY = b'{"status":"ok"}'


async def _healthz(_: Request) -> Response:
    """`GET /healthz` in the lean lane: what FastAPI sends for `get_healthz`'s dict."""
    return Response(_HEALTHY, media_type="application/json")


class CountsRequests:
    """ASGI middleware: each HTTP request is `activity.running()` from its first byte in
    to its last byte out, so the process's background scans (the eligibility gate's
    re-checks) run their chunks in the gaps between requests (`contracts.pacing`). The
    `skip` paths (streamed imports: minutes long) are not counted: they would keep a
    scan at its slowest all along."""

    def __init__(self, app: ASGIApp, *, activity: Activity, skip: frozenset[str]) -> None:
        self._app = app
        self._activity = activity
        self._skip = skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") in self._skip:
            await self._app(scope, receive, send)
            return
        with self._activity.running():
            await self._app(scope, receive, send)


class ApiKeyHeader:
    """ASGI middleware for a configured API-key header other than `x-api-key`
    (`ORRERY_API_KEY_HEADER`): its value is what the routes read as `x-api-key`, and an
    `x-api-key` the client sent besides is dropped (only the configured header counts)."""

    def __init__(self, app: ASGIApp, *, header: str) -> None:
        self._app = app
        self._header = header.lower().encode("latin-1")
        self._target = API_KEY_HEADER.encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = [
                (self._target if name == self._header else name, value)
                for name, value in scope["headers"]
                if name != self._target
            ]
            scope = {**scope, "headers": headers}
        await self._app(scope, receive, send)


def _error(code: ErrorCode, message: str, details: dict[str, Any] | None = None) -> JSONResponse:
    err = OrreryError(code, message, details)
    note_error(code.value)
    return JSONResponse(
        err.to_response().model_dump(mode="json"),
        status_code=err.http_status,
        headers=retry_after(err.http_status),
    )


_FRAMEWORK_CODES = {
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
}


def install_request_guard(
    app: FastAPI,
    *,
    max_body_bytes: int,
    stream_paths: Sequence[str] = (),
    max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES,
) -> BodyLimits:
    """Every app's body limit and content-type check (`orrery.guard`); `stream_paths`
    take JSON lines up to `max_stream_bytes`. Returns the limits the guard applies, for
    the OpenAPI document (`install_openapi(body_limits=…)`)."""
    limits = BodyLimits(max_body_bytes, frozenset(stream_paths), max_stream_bytes)
    app.add_middleware(RequestGuard, limits=limits)
    return limits


def install_openapi(
    app: FastAPI, facts: dict[str, Any] | None = None, *, body_limits: BodyLimits | None = None
) -> None:
    """Serve the app's OpenAPI document as `contracts.openapi.finish_document` makes it:
    request bodies and success models as the routes declare them, Orrery's error shape
    for every error status, components equal to `docs/schemas/` with this deployment's
    `facts` filled in; with `body_limits` (the request guard's), each body-carrying
    operation's limit and its `413 body_too_large` (`orrery.guard.BodyLimits.document`)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = finish_document(generate(), facts)
            if body_limits is not None:
                body_limits.document(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _leaf_routes(routes: Iterable[Any]) -> Iterator[BaseRoute]:
    """Every route that answers requests, through included routers (FastAPI keeps an
    included router as one entry whose `effective_candidates()` are its routes)."""
    for route in routes:
        children = getattr(route, "effective_candidates", None)
        if callable(children):
            yield from _leaf_routes(children())
        else:
            yield route


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods of every route of `app` whose path matches the request's (the `Allow`
    header of a `405`), in a fixed order."""
    methods: set[str] = set()
    for route in _leaf_routes(app.router.routes):
        match, _ = route.matches({**scope, "method": ""})
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    order = {m: i for i, m in enumerate(_METHOD_ORDER)}
    return sorted(methods, key=lambda m: (order.get(m, len(order)), m))


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves as `{success: false, error: {code, message, details}}`."""

    @app.exception_handler(OrreryError)
    async def _orrery(_: Request, exc: OrreryError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(
            ErrorCode.INVALID_REQUEST,
            "the request is invalid",
            {"errors": json.loads(json.dumps(exc.errors(), default=str))},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The framework's own errors (no route, wrong method, …) get the code of their
        # status; the status sent is always the code's one (`HTTP_STATUS`).
        code = _FRAMEWORK_CODES.get(
            exc.status_code,
            ErrorCode.INVALID_REQUEST if exc.status_code < 500 else ErrorCode.INTERNAL,
        )
        headers = exc.headers
        details: dict[str, Any] = {}
        if exc.status_code == 405:
            # The framework names the methods of the first route whose path matched;
            # a path several routes share (PUT and DELETE of one profile) has them all.
            allowed = allowed_methods(request.app, request.scope)
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
            details = {"allowed": allowed}
        body = ErrorResponse(error=ErrorBody(code=code, message=str(exc.detail), details=details))
        note_error(code.value)
        return JSONResponse(
            body.model_dump(mode="json"),
            status_code=HTTP_STATUS[code],
            headers=retry_after(HTTP_STATUS[code], headers),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return _error(ErrorCode.INTERNAL, "internal error; see the server log")
