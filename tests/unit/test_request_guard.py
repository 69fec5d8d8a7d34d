"""The request guard and the framework error mapping, in process: body limit (declared
and streamed), content type, 405; and every app factory installs the guard."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict

from contracts.pacing import Activity
from orrery.guard import RequestGuard
from orrery.http import build_app, install_error_handlers, install_request_guard
from query.entrypoints.http import parse_body

LIMIT = 4_096
ROOT = Path(__file__).resolve().parents[2]


class Echo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    install_request_guard(app, max_body_bytes=LIMIT)

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, Any]:
        return {"length": len((await parse_body(request, Echo)).text)}

    return app


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(make_app(), raise_server_exceptions=False) as test_client:
        yield test_client


def error_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text[:300]
    body = response.json()
    assert body["success"] is False and body["error"]["code"] == code, response.text[:300]
    assert body["error"]["message"]
    return dict(body["error"])


def chunks(total: int, size: int = 1_000) -> Iterator[bytes]:
    yield b'{"text": "'
    for _ in range(total // size):
        yield b"x" * size
    yield b'"}'


def test_a_body_within_the_limit_passes(client: TestClient) -> None:
    response = client.post("/echo", json={"text": "x" * (LIMIT - 100)})
    assert response.status_code == 200 and response.json() == {"length": LIMIT - 100}
    streamed = client.post("/echo", content=chunks(LIMIT - 100))
    assert streamed.status_code == 200, streamed.text[:300]


def test_a_declared_oversized_body_is_413(client: TestClient) -> None:
    error = error_of(client.post("/echo", json={"text": "x" * LIMIT}), 413, "body_too_large")
    assert error["details"] == {"max_body_bytes": LIMIT}


def test_a_streamed_oversized_body_is_413_without_content_length(client: TestClient) -> None:
    error_of(client.post("/echo", content=chunks(LIMIT * 10)), 413, "body_too_large")


def test_a_non_json_content_type_is_415(client: TestClient) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        response = client.post(
            "/echo", content=b'{"text": "a"}', headers={"content-type": content_type}
        )
        error_of(response, 415, "unsupported_media_type")
    for content_type in (
        "application/json",
        "application/json; charset=utf-8",
        "application/x+json",
    ):
        response = client.post(
            "/echo", content=b'{"text": "a"}', headers={"content-type": content_type}
        )
        assert response.status_code == 200, (content_type, response.text[:300])


def test_framework_errors_get_their_own_codes(client: TestClient) -> None:
    response = client.put("/echo", json={"text": "a"})
    error_of(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    error_of(client.get("/nowhere"), 404, "not_found")


def test_hostile_json_is_400_invalid_json(client: TestClient) -> None:
    for raw in (b"[" * 2_000, b'{"text": NaN}', b'{"text": "a", "text": "b"}', b"\xff"):
        response = client.post("/echo", content=raw, headers={"content-type": "application/json"})
        error_of(response, 400, "invalid_json")


def test_the_ingest_only_app_is_guarded() -> None:
    with TestClient(build_app("Orrery ingest", [], max_body_bytes=LIMIT)) as ingest:
        error_of(ingest.post("/healthz", content=b"x" * (LIMIT + 1)), 413, "body_too_large")
        error_of(
            ingest.post("/healthz", content=b"{}", headers={"content-type": "text/plain"}),
            415,
            "unsupported_media_type",
        )
        error_of(ingest.post("/healthz", json={}), 405, "method_not_allowed")


PACKAGES = {"contracts", "ingest", "orrery", "projector", "query"}


def test_every_app_factory_installs_the_guard() -> None:
    """Search, not an example: a FastAPI app built anywhere in the packages without the
    guard fails here."""
    built = 0
    for path in sorted(ROOT.glob("*/**/*.py")):
        if path.parts[len(ROOT.parts)] not in {
            "contracts",
            "ingest",
            "orrery",
            "projector",
            "query",
        }:
            continue
        source = path.read_text()
        apps = len(re.findall(r"\bFastAPI\(", source))
        built += apps
        guarded = source.count("install_request_guard(app") + source.count(
            "add_middleware(RequestGuard"
        )
        assert guarded >= apps, f"{path.relative_to(ROOT)}: {apps} FastAPI() but {guarded} guards"
    assert built >= 1


def test_the_guard_refuses_a_nonsense_limit() -> None:
    with pytest.raises(ValueError):
        RequestGuard(FastAPI(), max_body_bytes=0)


def test_a_streamed_path_takes_json_lines_past_the_body_limit() -> None:
    app = FastAPI()
    install_error_handlers(app)
    install_request_guard(
        app, max_body_bytes=LIMIT, stream_paths=["/lines"], max_stream_bytes=LIMIT * 4
    )

    @app.post("/lines")
    async def lines(request: Request) -> dict[str, Any]:
        count = 0
        async for chunk in request.stream():
            count += chunk.count(b"\n")
        return {"lines": count}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, Any]:
        return {"length": len((await parse_body(request, Echo)).text)}

    body = b'{"text": "x"}\n' * (LIMIT * 2 // 14)
    ndjson = {"content-type": "application/x-ndjson"}
    with TestClient(app, raise_server_exceptions=False) as test:
        answer = test.post("/lines", content=body, headers=ndjson)
        assert answer.status_code == 200 and answer.json() == {"lines": LIMIT * 2 // 14}
        error_of(test.post("/lines", content=body * 3, headers=ndjson), 413, "body_too_large")
        error_of(test.post("/echo", content=b"{}", headers=ndjson), 415, "unsupported_media_type")
        error_of(
            test.post("/lines", content=b"x", headers={"content-type": "text/csv"}),
            415,
            "unsupported_media_type",
        )


def test_the_document_states_each_body_routes_limit_as_the_guard_applies_it() -> None:
    """`build_app`'s `/openapi.json` gives each POST/PUT/PATCH operation the limit the
    guard applies to its path (a streamed path its own) in `x-orrery-max-body-bytes` and
    in its `413`; one byte more, declared or chunked, is that `413 body_too_large`."""
    from fastapi import APIRouter

    from contracts.openapi import operation
    from contracts.topk import TopKRequest, TopKResponse
    from orrery.guard import MAX_BODY_BYTES_KEY

    router = APIRouter()
    extra = operation(body=TopKRequest, ok=TopKResponse)

    @router.post("/lines", openapi_extra=extra)
    async def lines(request: Request) -> dict[str, Any]:
        return {"bytes": sum([len(chunk) async for chunk in request.stream()])}

    @router.put("/echo", openapi_extra=extra)
    async def echo(request: Request) -> dict[str, Any]:
        return {"length": len((await parse_body(request, Echo)).text)}

    app = build_app(
        "guarded", [router], max_body_bytes=LIMIT, stream_paths=["/lines"],
        max_stream_bytes=LIMIT * 4,
    )  # fmt: skip
    with TestClient(app, raise_server_exceptions=False) as test:
        paths = test.get("/openapi.json").json()["paths"]
        assert "x-orrery-max-body-bytes" not in paths["/healthz"]["get"]
        for method, path, limit in (("post", "/lines", LIMIT * 4), ("put", "/echo", LIMIT)):
            op = paths[path][method]
            assert op[MAX_BODY_BYTES_KEY] == limit
            assert f"a body over {limit} bytes" in op["responses"]["413"]["description"]
            for content in (b"x" * (limit + 1), iter([b"x" * 1_000] * (limit // 1_000 + 1))):
                error = error_of(test.request(method, path, content=content), 413, "body_too_large")
                assert error["details"] == {"max_body_bytes": limit}


def test_every_request_but_a_streamed_one_is_counted_in_flight() -> None:
    """`build_app(activity=…)`: a request is in flight from its first byte in to its last
    out (the eligibility gate's re-checks wait for the gaps); streamed imports are not
    counted (minutes long, they would hold a re-check at its slowest all along)."""
    activity = Activity()
    router = APIRouter()

    @router.get("/busy")
    async def busy() -> dict[str, int]:
        return {"in_flight": activity.in_flight}

    @router.post("/stream")
    async def stream() -> dict[str, int]:
        return {"in_flight": activity.in_flight}

    app = build_app("t", [router], stream_paths=["/stream"], activity=activity)
    with TestClient(app) as test_client:
        assert test_client.get("/busy").json() == {"in_flight": 1}
        answer = test_client.post(
            "/stream", content=b"{}\n", headers={"content-type": "application/x-ndjson"}
        )
        assert answer.json() == {"in_flight": 0}
        plain = {"content-type": "text/plain"}
        refused = test_client.post("/busy", content=b"x" * 10, headers=plain)
        assert refused.status_code == 415
    assert activity.in_flight == 0
