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
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.auth import Access, declare
from contracts.errors import HTTP_STATUS, ErrorBody, ErrorCode, ErrorResponse, OrreryError
from contracts.openapi import finish_document, operation
from contracts.ops import HealthResponse
from orrery.guard import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_STREAM_BYTES, RequestGuard
from orrery.lean import LeanRoutes, lean_endpoints
from query.entrypoints.http import LEAN_ROUTES

__all__ = ["build_app", "install_error_handlers", "install_openapi", "install_request_guard"]

log = logging.getLogger("orrery.http")

_NO_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
}


def build_app(
    title: str,
    routers: Sequence[APIRouter],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    stream_paths: Sequence[str] = (),
    max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES,
) -> FastAPI:
    """An app with Orrery's error shape, request guard and OpenAPI document, `/healthz`,
    and `routers` mounted in order; the one-shot query routes among them
    (`query.entrypoints.http.LEAN_ROUTES`) are answered by `orrery.lean.LeanRoutes`,
    inside the request guard and every middleware added later."""
    # FastAPI's native OpenTelemetry bridge looks the global providers up on every
    # request; Orrery configures none, so it would only ever find them unconfigured.
    app = FastAPI(title=title, version="0.1.0", telemetry=_NO_TELEMETRY)
    install_error_handlers(app)
    # Filled once the routers are mounted (below); the middleware stack is built at the
    # first request. Added first, so it is the innermost middleware.
    lean: dict[tuple[str, str], Any] = {}
    app.add_middleware(LeanRoutes, endpoints=lean)
    install_request_guard(app, max_body_bytes=max_body_bytes, stream_paths=stream_paths,
                          max_stream_bytes=max_stream_bytes)  # fmt: skip
    install_openapi(app)

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
    lean.update(lean_endpoints(routers, LEAN_ROUTES))
    return app


def _error(code: ErrorCode, message: str, details: dict[str, Any] | None = None) -> JSONResponse:
    err = OrreryError(code, message, details)
    return JSONResponse(err.to_response().model_dump(mode="json"), status_code=err.http_status)


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
) -> None:
    """Every app's body limit and content-type check (`orrery.guard`); `stream_paths`
    take JSON lines up to `max_stream_bytes`."""
    app.add_middleware(
        RequestGuard,
        max_body_bytes=max_body_bytes,
        stream_paths=stream_paths,
        max_stream_bytes=max_stream_bytes,
    )


def install_openapi(app: FastAPI) -> None:
    """Serve the app's OpenAPI document as `contracts.openapi.finish_document` makes it:
    request bodies and success models as the routes declare them, Orrery's error shape
    for every error status, components equal to `docs/schemas/`."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = finish_document(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves as `{success: false, error: {code, message, details}}`."""

    @app.exception_handler(OrreryError)
    async def _orrery(_: Request, exc: OrreryError) -> JSONResponse:
        return JSONResponse(exc.to_response().model_dump(mode="json"), status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(
            ErrorCode.INVALID_REQUEST,
            "the request is invalid",
            {"errors": json.loads(json.dumps(exc.errors(), default=str))},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The framework's own errors (no route, wrong method, …) get the code of their
        # status; the status sent is always the code's one (`HTTP_STATUS`).
        code = _FRAMEWORK_CODES.get(
            exc.status_code,
            ErrorCode.INVALID_REQUEST if exc.status_code < 500 else ErrorCode.INTERNAL,
        )
        body = ErrorResponse(error=ErrorBody(code=code, message=str(exc.detail)))
        return JSONResponse(
            body.model_dump(mode="json"), status_code=HTTP_STATUS[code], headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return _error(ErrorCode.INTERNAL, "internal error; see the server log")
