"""What every app answers with, whatever the route: `Retry-After` on 429/503, and the
API key read from the configured header (`ORRERY_API_KEY_HEADER`)."""

from __future__ import annotations

from fastapi import APIRouter, Header
from fastapi.testclient import TestClient

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from orrery.http import build_app


def _router() -> APIRouter:
    router = APIRouter()

    @router.get("/busy")
    async def busy() -> None:
        raise DependencyUnavailable("postgres", "down")

    @router.get("/backlog")
    async def backlog() -> None:
        raise OrreryError(ErrorCode.INGEST_BACKLOG, "later")

    @router.get("/bad")
    async def bad() -> None:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "no")

    @router.get("/key")
    async def key(x_api_key: str | None = Header(default=None)) -> dict[str, str | None]:
        return {"key": x_api_key}

    return router


def test_every_503_says_when_to_retry() -> None:
    client = TestClient(build_app("t", [_router()]))
    for path in ("/busy", "/backlog"):
        answer = client.get(path)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert "retry-after" not in client.get("/bad").headers


def test_the_api_key_header_is_configurable() -> None:
    default = TestClient(build_app("t", [_router()]))
    assert default.get("/key", headers={"x-api-key": "k"}).json() == {"key": "k"}
    custom = TestClient(build_app("t", [_router()], api_key_header="X-Twinr-Key"))
    assert custom.get("/key", headers={"x-twinr-key": "k"}).json() == {"key": "k"}
    # Only the configured header counts once another is configured.
    assert custom.get("/key", headers={"x-api-key": "k"}).json() == {"key": None}
