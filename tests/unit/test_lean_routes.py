"""The lean lane (`orrery.lean`): the one-shot routes answered without the framework's
routing, with exactly the app's answers, errors, guard and OpenAPI document."""

from __future__ import annotations

import json

import pytest
from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from fastapi.testclient import TestClient

from contracts.errors import ErrorCode, OrreryError
from orrery.http import build_app
from orrery.lean import LeanRoutes, lean_endpoints
from query.entrypoints.http import LEAN_ROUTES, RETRIEVE_PATH, TOPK_PATH

CALLS: list[str] = []


def _router() -> APIRouter:
    router = APIRouter()

    @router.post(TOPK_PATH)
    async def topk(request: Request) -> Response:
        CALLS.append(request.scope["path"])
        body = json.loads(await request.body())
        if body.get("fail") == "orrery":
            raise OrreryError(ErrorCode.UNKNOWN_SCOPE, "no such scope", {"scope_ref": "x"})
        if body.get("fail") == "bug":
            raise RuntimeError("a bug")
        return Response(json.dumps({"echo": body}), media_type="application/json")

    @router.post(RETRIEVE_PATH)
    async def retrieve(request: Request) -> Response:
        return Response(b'{"ok":true}', media_type="application/json")

    @router.post("/elsewhere")
    async def elsewhere(request: Request) -> Response:
        raise OrreryError(ErrorCode.UNKNOWN_SCOPE, "no such scope", {"scope_ref": "x"})

    return router


@pytest.fixture
def client() -> TestClient:
    CALLS.clear()
    return TestClient(
        build_app("test", [_router()], max_body_bytes=1_000), raise_server_exceptions=False
    )


def test_the_lane_takes_exactly_the_one_shot_routes() -> None:
    endpoints = lean_endpoints([_router()], LEAN_ROUTES)
    assert set(endpoints) == {("POST", TOPK_PATH), ("POST", RETRIEVE_PATH)}


def test_a_route_with_parameters_is_refused() -> None:
    router = APIRouter()

    @router.post(TOPK_PATH)
    async def topk(request: Request, x_api_key: str | None = Header(default=None)) -> Response:
        return Response(b"{}")

    with pytest.raises(ValueError, match="only the request"):
        lean_endpoints([router], LEAN_ROUTES)


def test_answers_and_errors_leave_as_the_app_sends_them(client: TestClient) -> None:
    ok = client.post(TOPK_PATH, json={"q": 1})
    assert ok.status_code == 200 and ok.json() == {"echo": {"q": 1}}
    assert ok.headers["content-type"] == "application/json"
    assert CALLS == [TOPK_PATH]

    lane = client.post(TOPK_PATH, json={"fail": "orrery"})
    framework = client.post("/elsewhere", json={})
    assert lane.status_code == framework.status_code == 404
    assert lane.json() == framework.json()
    assert lane.json()["error"]["code"] == "unknown_scope"

    bug = client.post(TOPK_PATH, json={"fail": "bug"})
    assert bug.status_code == 500
    assert bug.json() == {
        "success": False,
        "error": {
            "code": "internal",
            "message": "internal error; see the server log",
            "details": {},
        },
    }


def test_other_methods_and_the_guard_are_the_apps(client: TestClient) -> None:
    assert client.get(TOPK_PATH).status_code == 405
    assert client.get(TOPK_PATH).json()["error"]["code"] == "method_not_allowed"
    too_big = client.post(TOPK_PATH, content=b"{" + b" " * 2_000 + b"}")
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "body_too_large"
    wrong_type = client.post(TOPK_PATH, content=b"{}", headers={"content-type": "text/plain"})
    assert wrong_type.status_code == 415
    assert CALLS == []


def test_the_openapi_document_still_lists_the_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "post" in paths[TOPK_PATH] and "post" in paths[RETRIEVE_PATH]


def test_a_middleware_added_later_sees_lane_requests() -> None:
    app = build_app("test", [_router()])
    seen: list[str] = []

    class Observe:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        async def __call__(self, scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
            seen.append(scope["path"])
            await self.inner(scope, receive, send)  # type: ignore[operator]

    app.add_middleware(Observe)
    assert TestClient(app).post(TOPK_PATH, json={}).status_code == 200
    assert seen == [TOPK_PATH]
    assert any(m.cls is LeanRoutes for m in app.user_middleware)


def test_healthz_leaves_the_lane_as_its_route_sends_it() -> None:
    app = build_app("test", [_router()])
    client = TestClient(app)
    lane = client.get("/healthz")
    # The built middleware stack's lane, without its `/healthz`: FastAPI's own answer.
    node: object = app.middleware_stack
    while not isinstance(node, LeanRoutes):
        node = node.app  # type: ignore[attr-defined]
    assert ("GET", "/healthz") in node.endpoints
    del node.endpoints[("GET", "/healthz")]  # type: ignore[attr-defined]
    route = client.get("/healthz")
    assert lane.status_code == route.status_code == 200
    assert lane.content == route.content == b'{"status":"ok"}'
    assert list(lane.headers.items()) == list(route.headers.items())
    assert client.post("/healthz").status_code == 405
