"""Property-based tenancy: random keys, writes, tombstones and reads over every tenant
route of a real embedded stack (SQLite, tantivy, qdrant-edge; in-process ASGI client).

Invariant: no response to a key ever contains, or differs by the existence of, a
document outside that key's reach. The model predicts every answer from what the key
itself can see, so an answer that depends on a foreign document (a 409 for a write that
is new within the key's reach, a payload another tenant wrote, an id of another galaxy
listed or treated unlike an unknown id) fails the run.

`ORRERY_TENANCY_EXAMPLES` (default 200 of up to 20 steps; at least 2,000 steps run)
sets the size;
`make bench` runs more.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from contracts.auth import ApiKeyGrant, parse_api_keys
from contracts.records import derive_document_id
from orrery.embedded import EmbeddedStack
from query.settings import QuerySettings
from tests.fakes import FakeHashingEmbedder

pytestmark = [pytest.mark.slow]

KEYS_SPEC = "ka=tenant-a,ka1=tenant-a/g1,ka2=tenant-a/g2,kb=tenant-b,kb1=tenant-b/g1"
GRANTS: dict[str, ApiKeyGrant] = parse_api_keys(KEYS_SPEC)
KEYS = sorted(GRANTS)
NAMESPACES = ["tenant-a", "tenant-b"]
GALAXIES = ["default", "g1", "g2"]
ITEMS = [f"item-{i}" for i in range(4)]
KIND = "objects"
SCOPE = "longterm:objects:current"
STEPS = 20
EXAMPLES = int(os.environ.get("ORRERY_TENANCY_EXAMPLES", "200"))
MIN_STEPS = EXAMPLES * 10  # hypothesis draws up to STEPS per example

Identity = tuple[str, str, str]  # namespace, galaxy, item_id


def reaches(key: str, namespace: str, galaxy: str) -> bool:
    grant = GRANTS[key]
    return grant.namespace == namespace and grant.galaxy in (None, galaxy)


def doc_id(identity: Identity) -> str:
    namespace, galaxy, item = identity
    return derive_document_id(namespace, KIND, item, galaxy)


@dataclass
class Model:
    """What the server holds, kept across examples (the server is not reset)."""

    revision: dict[Identity, int] = field(default_factory=dict)
    payload: dict[Identity, dict[str, Any] | None] = field(default_factory=dict)
    history: dict[Identity, list[dict[str, Any]]] = field(default_factory=dict)
    by_id: dict[str, Identity] = field(default_factory=dict)
    nonce: int = 0
    steps: int = 0


MODEL = Model()
CLIENT: dict[str, TestClient] = {}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings_ = QuerySettings(
        data_dir=Path(tmp_path_factory.mktemp("tenancy")) / "data",
        api_keys=KEYS_SPEC,
        projector_poll_seconds=0.05,
    )
    stack = EmbeddedStack.open(settings_, embedder=FakeHashingEmbedder(dimension=32))
    stack.start()
    try:
        with TestClient(stack.app) as test_client:
            CLIENT["c"] = test_client
            yield test_client
    finally:
        CLIENT.clear()
        stack.close()


def identities() -> st.SearchStrategy[Identity]:
    return st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(GALAXIES), st.sampled_from(ITEMS))


def never_written(response: Any, namespace: str) -> bool:
    """A `404 unknown_namespace`: nothing was ever written to `namespace` (a fact about
    the namespace, never about one document) — checked against the model."""
    if response.status_code != 404 or response.json()["error"]["code"] != "unknown_namespace":
        return False
    assert not [i for i in MODEL.by_id.values() if i[0] == namespace], response.text[:300]
    return True


class Tenancy(RuleBasedStateMachine):
    @initialize()
    def connect(self) -> None:
        self.http = CLIENT["c"]

    def call(self, key: str, method: str, path: str, **kwargs: Any) -> Any:
        MODEL.steps += 1
        response = self.http.request(method, path, headers={"x-api-key": key}, **kwargs)
        # A scope without a live generation yet is 503 scope_not_ready: a fact about the
        # namespace's scope (docs/reliability.md), never about one document.
        # Readiness itself answers 503 with its body while not ready.
        body = response.json() if response.status_code == 503 else {}
        code = (body.get("error") or {}).get("code")
        not_ready = response.status_code == 503 and (
            code in ("scope_not_ready", "coverage_unavailable") or body.get("ready") is False
        )
        assert response.status_code < 500 or not_ready, response.text[:300]
        return response

    @rule(
        key=st.sampled_from(KEYS),
        identity=identities(),
        deleted=st.booleans(),
        explicit=st.sampled_from(["none", "own", "foreign"]),
    )
    def write(self, key: str, identity: Identity, deleted: bool, explicit: str) -> None:
        namespace, galaxy, item = identity
        MODEL.nonce += 1
        payload = {"by": key, "nonce": MODEL.nonce}
        record: dict[str, Any] = {
            "namespace": namespace,
            "snapshot_kind": KIND,
            "item_id": item,
            "galaxy": galaxy,
            "revision": MODEL.revision.get(identity, 0) + 1,
            "deleted": deleted,
            "payload": payload,
            "text": {"title": f"{item} thing", "body": f"{item} in {galaxy}"},
        }
        if explicit == "own":
            record["document_id"] = doc_id(identity)
        elif explicit == "foreign":
            other = GALAXIES[(GALAXIES.index(galaxy) + 1) % len(GALAXIES)]
            record["document_id"] = doc_id((namespace, other, item))
        response = self.call(key, "POST", "/v1/records", json=[record])
        if not reaches(key, namespace, galaxy):
            assert response.status_code == 403, response.text[:300]
            return
        if explicit == "foreign":
            assert response.status_code == 422, response.text[:300]
            return
        assert response.status_code == 200, response.text[:300]
        assert [i["status"] for i in response.json()["items"]] == [201]
        MODEL.revision[identity] = record["revision"]
        MODEL.payload[identity] = None if deleted else payload
        MODEL.history.setdefault(identity, []).append(payload)
        MODEL.by_id[doc_id(identity)] = identity

    @rule(
        key=st.sampled_from(KEYS),
        namespace=st.sampled_from(NAMESPACES),
        asked=st.lists(identities(), min_size=1, max_size=6, unique=True),
        unknown=st.booleans(),
    )
    def read_by_id(self, key: str, namespace: str, asked: list[Identity], unknown: bool) -> None:
        ids = [doc_id(i) for i in asked]
        if unknown:
            ids.append(derive_document_id(namespace, KIND, "never-written"))
        response = self.call(
            key, "POST", "/v1/records/by_id", json={"namespace": namespace, "document_ids": ids}
        )
        if GRANTS[key].namespace != namespace:
            assert response.status_code == 403, response.text[:300]
            return
        assert response.status_code == 200, response.text[:300]
        body = response.json()
        expected = {
            doc_id(i): MODEL.payload[i]
            for i in asked
            if i[0] == namespace and reaches(key, *i[:2]) and MODEL.payload.get(i) is not None
        }
        got = {r["document_id"]: r["payload"] for r in body["records"]}
        assert got == expected
        assert sorted(body["missing"]) == sorted(d for d in ids if d not in expected)

    @rule(key=st.sampled_from(KEYS), namespace=st.sampled_from(NAMESPACES))
    def list_document_ids(self, key: str, namespace: str) -> None:
        response = self.call(
            key,
            "GET",
            "/v1/scopes/document_ids",
            params={"namespace": namespace, "scope_ref": SCOPE},
        )
        if GRANTS[key].namespace != namespace:
            assert response.status_code == 403, response.text[:300]
            return
        if response.status_code == 503 or never_written(response, namespace):  # no generation
            return
        assert response.status_code == 200, response.text[:300]
        for listed in response.json()["document_ids"]:
            identity = MODEL.by_id[listed]
            assert reaches(key, identity[0], identity[1]), (key, identity)

    @rule(
        key=st.sampled_from(KEYS),
        namespace=st.sampled_from(NAMESPACES),
        text=st.sampled_from([*ITEMS, "thing", "g1", "g2 default"]),
    )
    def topk(self, key: str, namespace: str, text: str) -> None:
        response = self.call(
            key,
            "POST",
            "/v1/external/retrieve/topk_records",
            json={
                "namespace": namespace,
                "scope_ref": SCOPE,
                "query_text": text,
                "result_limit": 20,
            },
        )
        if GRANTS[key].namespace != namespace:
            assert response.status_code == 403, response.text[:300]
            return
        if response.status_code == 503 or never_written(response, namespace):
            return
        assert response.status_code == 200, response.text[:300]
        for result in response.json()["results"]:
            identity = MODEL.by_id[result["document_id"]]
            assert reaches(key, identity[0], identity[1]), (key, identity)
            assert result["payload"] in MODEL.history[identity]

    @rule(key=st.sampled_from(KEYS))
    def readiness(self, key: str) -> None:
        body = self.call(key, "GET", "/v1/readiness").json()
        grant = GRANTS[key]
        assert all(s["namespace"] == grant.namespace for s in body["scopes"])
        if grant.galaxy is not None:
            assert all("document_count" not in s for s in body["scopes"])


def test_no_answer_depends_on_a_document_outside_the_keys_reach(client: TestClient) -> None:
    anonymous = client.get("/v1/readiness")
    assert anonymous.status_code == 401
    run = Tenancy.TestCase
    run.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    run().runTest()
    assert MODEL.steps >= MIN_STEPS, f"only {MODEL.steps} steps ran"


def test_every_route_declares_its_access_and_refuses_without_a_key(client: TestClient) -> None:
    """A route added later (a dialect, an ops view) cannot skip authorization unseen."""
    from fastapi.routing import APIRoute

    from contracts.auth import ACCESS_EXTENSION, Access

    routes = [r for r in client.app.routes if isinstance(r, APIRoute)]  # type: ignore[attr-defined]
    assert routes
    for route in routes:
        declared = (route.openapi_extra or {}).get(ACCESS_EXTENSION)
        assert declared in {a.value for a in Access}, f"{route.path} declares no access"
        if declared == Access.PUBLIC:
            continue
        path = route.path.replace("{generation_id}", "g1")
        for method in route.methods:
            params = {"namespace": "tenant-a", "scope_ref": SCOPE}
            response = client.request(method, path, json={}, params=params)
            assert response.status_code == 401, (method, path, response.text[:200])
            assert response.json()["error"]["code"] == "unauthorized"
