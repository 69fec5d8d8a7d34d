"""The strict wire of issue 22, over HTTP against a real `orrery serve` (embedded):
no coercion of a JSON type (`"result_limit": true`, `"includeChildren": "yes"`,
`{"keep": false}`) or of a query-string value (`include_content=yes`); `Allow` on every
`405` lists the path's methods; one galaxy-name rule on every route (`../g2` is `422`
wherever a galaxy is named); `sourceUri` escapes the namespace and the ring; two
backups of one name: one `200`, the other `409`.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest

from contracts.records import derive_document_id
from tests.e2e.conftest import Server, start_server

pytestmark = [pytest.mark.slow]

KEY, NS = "strict-key", "demo"
ODD_KEY, ODD_NS = "odd-key", "strict:a b?#%&=x"
BOUND_KEY = "bound-key"  # demo, galaxy g1
ADMIN = {"x-admin-key": "strict-admin"}
H = {"x-api-key": KEY}
SCOPE = "longterm:objects:current"
DIM = 384


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(
        tmp_path_factory.mktemp("strict") / "data",
        "--sample",
        env={
            "ORRERY_API_KEYS": f"{KEY}={NS},{ODD_KEY}={ODD_NS},{BOUND_KEY}={NS}/g1",
            "ORRERY_ADMIN_KEY": ADMIN["x-admin-key"],
        },
    )
    try:
        # The sample corpus is embedded on start: minutes on a loaded 2-core machine.
        server.wait_projected(timeout=600, headers=H)
        yield server
    finally:
        server.stop()


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    body: dict[str, Any] = response.json()
    assert body["error"]["code"] == code, body
    return body


TOPK = {"namespace": NS, "scope_ref": SCOPE, "query_text": "Thermoskanne"}
COERCED_BODIES = [
    ("/v1/external/retrieve/topk_records", {**TOPK, "result_limit": True}, "result_limit"),
    ("/v1/external/retrieve/topk_records", {**TOPK, "result_limit": "2"}, "result_limit"),
    ("/v1/external/retrieve/topk_records", {**TOPK, "include": {"payload": "yes"}}, "include"),
    ("/v1/external/retrieve/topk_records", {**TOPK, "timeout_seconds": "2"}, "timeout_seconds"),
    (
        "/v1/external/retrieve/topk_records",
        {"scope_ref": SCOPE, "result_limit": "2"},
        "result_limit",
    ),
    (
        "/v1/external/retrieve/topk_records",
        {"scope_ref": SCOPE, "include_content": 1},
        "include_content",
    ),
    ("/v1/external/retrieve", {**TOPK, "limit": 2.5}, "limit"),
    ("/v1/koutendb/retrieve", {"queryText": "x", "includeChildren": "yes"}, "includeChildren"),
    ("/v1/koutendb/plan", {"includeChildren": 0}, "includeChildren"),
    ("/v1/koutendb/plan", {"budget": "8"}, "budget"),
    ("/v1/records/by_id", {"namespace": NS, "document_ids": "x"}, "document_ids"),
]


@pytest.mark.parametrize(("path", "body", "field"), COERCED_BODIES)
def test_a_json_value_of_another_type_is_422_not_coerced(
    srv: Server, path: str, body: dict[str, Any], field: str
) -> None:
    out = _error(srv.client.post(path, json=body, headers=H), 422, "invalid_request")
    assert field in json.dumps(out["error"]["details"])


@pytest.mark.parametrize(
    "body",
    [
        [{"namespace": NS, "snapshot_kind": "objects", "item_id": "c", "revision": "1"}],
        [{"namespace": NS, "snapshot_kind": "objects", "item_id": "c", "revision": True}],
        [
            {
                "namespace": NS,
                "snapshot_kind": "objects",
                "item_id": "c",
                "revision": 1,
                "deleted": "false",
            }
        ],
        [
            {
                "namespace": NS,
                "snapshot_kind": "objects",
                "item_id": "c",
                "revision": 1,
                "metadata": {"updated_at": 1_700_000_000},
            }
        ],
    ],
)
def test_a_record_with_a_coerced_value_is_refused_and_nothing_is_written(
    srv: Server, body: list[dict[str, Any]]
) -> None:
    before = srv.client.get("/v1/readiness", headers=H).json()["log_high_water"]
    _error(srv.client.post("/v1/records", json=body, headers=H), 422, "invalid_request")
    assert srv.client.get("/v1/readiness", headers=H).json()["log_high_water"] == before


def test_admin_bodies_are_strict(srv: Server) -> None:
    gc = srv.client.post("/v1/admin/generations/gc", json={"keep": False}, headers=ADMIN)
    _error(gc, 422, "invalid_request")
    gc = srv.client.post("/v1/admin/generations/gc", json={"keep": "1"}, headers=ADMIN)
    _error(gc, 422, "invalid_request")
    backup = srv.client.post("/v1/admin/backups", json={"name": 7}, headers=ADMIN)
    _error(backup, 422, "invalid_request")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/external/records", {"include_metadata": "yes"}),
        ("/v1/external/records", {"limit": "8.0"}),
        ("/v1/external/records", {"offset": "+1"}),
        ("/v1/external/documents/full", {"document_id": "x", "include_content": "1"}),
        ("/v1/external/documents/full", {"document_id": "x", "max_content_chars": "1_000"}),
        ("/v1/koutendb/atlas", {"maxCentroidDims": "٣"}),
        ("/v1/koutendb/dump", {"includeVectors": "1"}),
        ("/v1/koutendb/dump", {"includeVectors": "True"}),
    ],
)
def test_query_strings_take_digits_and_true_or_false_only(
    srv: Server, path: str, params: dict[str, str]
) -> None:
    _error(srv.client.get(path, params=params, headers=H), 422, "invalid_request")


def test_query_strings_in_their_one_spelling_are_taken(srv: Server) -> None:
    listed = srv.client.get(
        "/v1/external/records", params={"include_metadata": "false", "limit": "2"}, headers=H
    )
    assert listed.status_code == 200, listed.text[:300]
    assert listed.json()["returned_count"] == 2
    dump = srv.client.get("/v1/koutendb/dump", params={"includeVectors": "false"}, headers=H)
    assert dump.status_code == 200, dump.text[:300]


def test_every_405_names_the_methods_of_its_path(srv: Server) -> None:
    document = srv.client.get("/openapi.json").json()
    methods = ("get", "put", "post", "delete", "patch")
    templates = {
        re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"): {
            m.upper() for m in item if m in methods
        }
        for path, item in document["paths"].items()
    }
    checked = 0
    for path in document["paths"]:
        concrete = re.sub(r"\{[^}]+\}", "x1", path)
        # Every template the path matches (`/records/bulk` is also `/records/{id}`).
        declared = set().union(*(m for t, m in templates.items() if t.match(concrete)))
        for method in sorted({m.upper() for m in methods} - declared):
            response = srv.client.request(method, concrete, headers=H)
            out = _error(response, 405, "method_not_allowed")
            allowed = [m.strip() for m in response.headers["allow"].split(",")]
            assert set(allowed) == declared, (method, path, allowed)
            assert out["error"]["details"]["allowed"] == allowed
            checked += 1
    assert checked > 100
    # The path two routes share: both methods, not only the first route's.
    shared = srv.client.get("/v1/koutendb/profiles/x", headers=H)
    assert shared.status_code == 405
    assert shared.headers["allow"] == "PUT, DELETE"


@pytest.mark.parametrize("galaxy", ["../g2", "g2/..", "", ".hidden", "a b", "x" * 129])
def test_one_galaxy_rule_on_every_route(srv: Server, galaxy: str) -> None:
    q = {"galaxy": galaxy}
    answers = [
        srv.client.get("/v1/koutendb/atlas", params=q, headers=H),
        srv.client.get("/v1/koutendb/recommendations", params=q, headers=H),
        srv.client.get("/v1/koutendb/dump", params=q, headers=H),
        srv.client.post("/v1/koutendb/import", params=q, content=b"", headers=H),
        srv.client.post("/v1/koutendb/retrieve", json={"queryText": "x", **q}, headers=H),
        srv.client.post("/v1/koutendb/plan", json=q, headers=H),
        srv.client.post(
            "/v1/external/retrieve/topk_records", json={**TOPK, "filters": q}, headers=H
        ),
        srv.client.post(
            "/v1/records",
            json=[
                {"namespace": NS, "snapshot_kind": "objects", "item_id": "g", "revision": 1, **q}
            ],
            headers=H,
        ),
    ]
    for response in answers:
        _error(response, 422, "invalid_request")
    # A key bound to a galaxy: naming another one is 403 first, on every route.
    bound = {"x-api-key": BOUND_KEY}
    for response in (
        srv.client.get("/v1/koutendb/atlas", params={"galaxy": "g2"}, headers=bound),
        srv.client.get("/v1/koutendb/dump", params={"galaxy": "g2"}, headers=bound),
        srv.client.post("/v1/koutendb/plan", json={"galaxy": "g2"}, headers=bound),
    ):
        _error(response, 403, "forbidden")


def test_source_uri_escapes_the_namespace_and_the_ring(srv: Server) -> None:
    odd = {"x-api-key": ODD_KEY}
    ring = "a b/c?d#e"
    record = {
        "namespace": ODD_NS,
        "snapshot_kind": "objects",
        "item_id": "only",
        "revision": 1,
        "ring": ring,
        "text": {"body": "strict wire escaping"},
        "vector": [1.0] + [0.0] * (DIM - 1),
    }
    written = srv.client.post("/v1/records", json=[record], headers=odd)
    assert written.status_code == 200, written.text[:300]
    srv.wait_projected(timeout=120, headers=odd)
    envelope = srv.client.post(
        "/v1/koutendb/retrieve", json={"queryText": "strict wire escaping"}, headers=odd
    )
    assert envelope.status_code == 200, envelope.text[:500]
    (chunk,) = envelope.json()["chunks"]
    uri = urlsplit(chunk["sourceUri"])
    doc_id = derive_document_id(ODD_NS, "objects", "only")
    assert (uri.scheme, uri.query, uri.fragment) == ("orrery", "", "")
    assert unquote(uri.netloc) == ODD_NS
    segments = uri.path.split("/")
    assert segments[1] == "default" and segments[-1] == doc_id
    assert unquote("/".join(segments[2:-1])) == ring


def test_two_backups_of_one_name_one_is_taken_the_other_is_409(srv: Server) -> None:
    def take() -> int:
        return srv.client.post(
            "/v1/admin/backups", json={"name": "twice"}, headers=ADMIN
        ).status_code

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        statuses = sorted(pool.map(lambda _: take(), range(4)))
    assert statuses == [200, 409, 409, 409]
    backups = Path(srv.data_dir) / "backups"
    assert [p.name for p in backups.iterdir()] == ["twice"]


def test_what_the_document_allows_the_server_takes(srv: Server) -> None:
    """Rules the document now states, and requests valid for it that were refused."""
    document = srv.client.get("/openapi.json").json()
    facts = document["info"]["x-orrery-deployment"]
    assert facts["max_result_limit"] == 500 and facts["vector_dimension"] == DIM
    # A body valid for ChonkyDB's schema of a two-shape path, without ChonkyDB-only
    # fields and without Orrery's namespace: answered (namespace from the key).
    for path in ("/v1/external/retrieve/topk_records", "/v1/external/retrieve"):
        answer = srv.client.post(
            path, json={"scope_ref": SCOPE, "query_text": "Thermoskanne"}, headers=H
        )
        assert answer.status_code == 200, (path, answer.text[:300])
    # JSON Schema's integer: 3.0 is one.
    three = srv.client.post(
        "/v1/external/retrieve/topk_records", json={**TOPK, "result_limit": 3.0}, headers=H
    )
    assert three.status_code == 200, three.text[:300]
    assert len(three.json()["results"]) == 3
    # documents/full naming no document finds none.
    _error(srv.client.get("/v1/external/documents/full", headers=H), 404, "not_found")
    # The plan refuses what retrieve would: an unknown fusion profile.
    plan = srv.client.post("/v1/koutendb/plan", json={"fusionProfile": "nope@1"}, headers=H)
    _error(plan, 422, "unknown_profile")
    # KoutenDB's validator takes any JSON and reports; the import an empty body.
    for body in (b"[1, 2]", b"null", b'"x"'):
        checked = srv.client.post(
            "/v1/koutendb/validate", content=body, headers={**H, "content-type": "application/json"}
        )
        assert checked.status_code == 200 and checked.json()["valid"] is False
    assert srv.client.post("/v1/koutendb/import", content=b"", headers=H).status_code == 200
