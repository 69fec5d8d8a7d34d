"""The lean lane: the one-shot query routes answered without the framework's routing.

FastAPI spends more per request than a one-shot query's own ranking on a small corpus:
two middlewares of its own, a match of the path against every route in turn, an
exit-stack per request and its exception wrapper. The hot routes need none of it —
their endpoints take the bare `Request` and return a finished `Response` — so
`LeanRoutes` (a pure ASGI middleware, the innermost one `build_app` installs) calls
such an endpoint directly for an exact `(method, path)` match, and hands everything
else to the app untouched.

What stays the same: the route is still the app's (the OpenAPI document lists it as
before; a method the lane does not take goes to the app, which answers 405), every
middleware installed around this one (the request guard, anything added later, such as
per-request metrics) still sees every request, and errors leave exactly as the app's
handlers (`orrery.http.install_error_handlers`) would send them: an `OrreryError` in
its own shape and status, anything else `500 internal` after logging it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import NamedTuple

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.errors import ErrorCode, OrreryError
from orrery.guard import error_response

__all__ = ["Endpoint", "LeanRoutes", "lean_endpoints"]

log = logging.getLogger("orrery.http")

Endpoint = Callable[[Request], Awaitable[Response]]
"""A route endpoint the lane can call: the bare request in, a finished response out."""


def lean_endpoints(
    routers: Iterable[APIRouter], paths: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], Endpoint]:
    """The endpoints of the routes `routers` declare (mounted without a prefix) for each
    `(method, path)` that has one; a path none of them routes is left out (a deployment
    without the query API). A route that takes anything but the bare request
    (parameters, dependencies) or is not a coroutine raises `ValueError`: the lane would
    skip what the framework does for it."""
    found: dict[tuple[str, str], Endpoint] = {}
    wanted = set(paths)
    for router in routers:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                continue
            for method in route.methods or ():
                key = (method, route.path)
                if key not in wanted:
                    continue
                dependant = route.dependant
                names = list(inspect.signature(route.endpoint).parameters)
                if (
                    names != [dependant.request_param_name]
                    or dependant.dependencies
                    or not inspect.iscoroutinefunction(route.endpoint)
                ):
                    raise ValueError(
                        f"{method} {route.path}: its endpoint must take only the request"
                    )
                found[key] = route.endpoint
    return found


class LeanRoutes:
    """Calls `endpoints[(method, path)]` directly for an exact match; every other
    request goes to `app`. Guarantee: a lane answer is byte for byte what the app would
    send for the same endpoint result or error (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, endpoints: Mapping[tuple[str, str], Endpoint]) -> None:
        self.app = app
        # Not copied: `build_app` fills it once its routers are mounted.
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            self.endpoints.get((scope["method"], scope["path"]))
            if scope["type"] == "http"
            else None
        )
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        # What the router would have set: telemetry labels the request by its template.
        scope["route"] = _LaneRoute(scope["path"])
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except OrreryError as exc:
            response = error_response(exc)
        except Exception as exc:
            log.exception("unhandled error", exc_info=exc)
            response = error_response(
                OrreryError(ErrorCode.INTERNAL, "internal error; see the server log")
            )
        await response(scope, receive, send)


class _LaneRoute(NamedTuple):
    """`scope["route"]` of a request the lane answers (its `path` is the template: the
    lane's routes have no path parameters)."""

    path: str
