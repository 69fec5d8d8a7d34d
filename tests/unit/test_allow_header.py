"""`Allow` on a `405` names every method of the path (issue 22: it named the first
route's only, and none of an included router's)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.testclient import TestClient

from orrery.http import build_app


def test_allow_lists_every_route_of_the_path_through_included_routers() -> None:
    profiles = APIRouter()

    @profiles.put("/profiles/{name}")
    def put_profile(name: str) -> dict[str, str]:
        return {"name": name}

    @profiles.delete("/profiles/{name}")
    def delete_profile(name: str) -> dict[str, str]:
        return {"name": name}

    admin = APIRouter(prefix="/v1/admin")

    @admin.post("/compact")
    def compact() -> dict[str, str]:
        return {}

    nested = APIRouter(prefix="/outer")
    nested.include_router(admin)
    client = TestClient(build_app("t", [profiles, admin, nested]))
    for method, path, allowed in [
        ("GET", "/profiles/x", ["PUT", "DELETE"]),
        ("POST", "/profiles/x", ["PUT", "DELETE"]),
        ("GET", "/v1/admin/compact", ["POST"]),
        ("PATCH", "/outer/v1/admin/compact", ["POST"]),
        ("POST", "/healthz", ["GET"]),
    ]:
        response = client.request(method, path)
        assert response.status_code == 405, (method, path)
        assert response.headers["allow"] == ", ".join(allowed), (method, path)
        error = response.json()["error"]
        assert error["code"] == "method_not_allowed"
        assert error["details"]["allowed"] == allowed
    assert client.get("/nowhere").status_code == 404
