"""Property: a galaxy-bound key never sees another galaxy through any `/v1/koutendb`
route of the query side (retrieve, plan, atlas, profiles, feedback, recommendations).

A real embedded stack in process (SQLite, tantivy, qdrant-edge; the hashing embedder),
three galaxies of one namespace sharing some ring names and differing in others, and
hypothesis drawing requests: any key, any galaxy parameter, any ring, words and query.
Every answer must be explainable from the key's own galaxy alone: its document ids,
ring names and counts — or `403 forbidden` when the request names another galaxy, or
`404 unknown_request` for another galaxy's envelope.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.records import derive_document_id
from orrery.embedded import EmbeddedStack
from query.settings import QuerySettings
from tests.fakes import FakeHashingEmbedder

pytestmark = [pytest.mark.slow]

NS = "kgal"
DIM = 16
GALAXIES = ("g1", "g2", "g3")
KEYS = {"ka": None, "k1": "g1", "k2": "g2", "k3": "g3"}
# A second tenant (its own namespace and key) that uses the same request ids.
OTHER_NS = "kgal-other"
KEYS_SPEC = ",".join(f"{k}={NS}" + (f"/{g}" if g else "") for k, g in KEYS.items()) + (
    f",kb={OTHER_NS}"
)
RINGS = {
    "g1": ("shared", "shared/one", "alpha", "alpha/deep/er"),
    "g2": ("shared", "shared/two", "beta"),
    "g3": ("gamma", "shared/one"),
}
EXAMPLES = int(os.environ.get("ORRERY_KOUTEN_EXAMPLES", "60"))


def _corpus() -> list[dict[str, Any]]:
    rng = random.Random(20261201)
    records = []
    for galaxy in GALAXIES:
        for n in range(12):
            ring = rng.choice(RINGS[galaxy])
            records.append(
                {
                    "namespace": NS,
                    "snapshot_kind": "objects",
                    "item_id": f"{galaxy}-{n}",
                    "revision": 1,
                    "galaxy": galaxy,
                    "ring": ring,
                    "payload": {"galaxy": galaxy, "n": n},
                    "text": {"body": f"note {n} about {ring.replace('/', ' ')}"},
                    "vector": [rng.uniform(-1, 1) for _ in range(DIM)],
                }
            )
    return records


CORPUS = _corpus()
IDS = {
    g: {derive_document_id(NS, "objects", r["item_id"], g) for r in CORPUS if r["galaxy"] == g}
    for g in GALAXIES
}
COUNTS = {g: Counter(r["ring"] for r in CORPUS if r["galaxy"] == g) for g in GALAXIES}


def known(galaxy: str) -> set[str]:
    out = set()
    for ring in COUNTS[galaxy]:
        parts = ring.split("/")
        out |= {"/".join(parts[: i + 1]) for i in range(len(parts))}
    return out


def client_ready(test_client: TestClient, key: str) -> bool:
    ready = test_client.get("/v1/readiness", headers={"x-api-key": key}).json()
    return bool(ready["ready"]) and sum(s["document_count"] for s in ready["scopes"]) > 0


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings_ = QuerySettings(
        data_dir=Path(tmp_path_factory.mktemp("kgal")) / "data",
        api_keys=KEYS_SPEC,
        projector_poll_seconds=0.05,
    )
    stack = EmbeddedStack.open(settings_, embedder=FakeHashingEmbedder(dimension=DIM))
    stack.start()
    try:
        with TestClient(stack.app) as test_client:
            written = test_client.post("/v1/records", json=CORPUS, headers={"x-api-key": "ka"})
            assert written.status_code == 200, written.text
            other = [{**r, "namespace": OTHER_NS} for r in CORPUS if r["galaxy"] == "g1"]
            written = test_client.post("/v1/records", json=other, headers={"x-api-key": "kb"})
            assert written.status_code == 200, written.text
            deadline = 600
            while deadline:
                ready = test_client.get("/v1/readiness", headers={"x-api-key": "ka"}).json()
                counts = {s["namespace"]: s["document_count"] for s in ready["scopes"]}
                theirs = client_ready(test_client, "kb")
                if ready["ready"] and counts.get(NS) == len(CORPUS) and theirs:
                    break
                deadline -= 1
                time.sleep(0.05)
            assert deadline, "projector did not catch up"
            yield test_client
    finally:
        stack.close()


@pytest.fixture(scope="module")
def envelopes(client: TestClient) -> dict[str, str]:
    """Five kept envelopes per galaxy (asked by the unbound key, so that every galaxy
    has recommendations): the first one's request id by galaxy."""
    for galaxy in GALAXIES:
        for n in range(5):
            response = client.post(
                "/v1/koutendb/retrieve",
                json={
                    "namespace": NS,
                    "galaxy": galaxy,
                    "queryText": "note",
                    "requestId": f"r-{galaxy}-{n}",
                },
                headers={"x-api-key": "ka"},
            )
            assert response.status_code == 200, response.text
            assert response.json()["chunks"], "each galaxy's envelope returns chunks"
    return {galaxy: f"r-{galaxy}-0" for galaxy in GALAXIES}


ring_names = st.sampled_from(sorted({r for rings in RINGS.values() for r in rings} | {"shared/x"}))
bodies = st.fixed_dictionaries(
    {},
    optional={
        "galaxy": st.sampled_from(GALAXIES),
        "ring": ring_names,
        "amount": st.sampled_from(["raFew", "raMany", "raAllUseful"]),
        "scope": st.sampled_from(["ssTight", "ssNear", "ssWide", "ssAll"]),
        "depth": st.sampled_from(["sdShallow", "sdDeep", "sdVeryDeep"]),
        "focus": st.integers(0, 120),
        "topRings": st.integers(0, 600),
        "queryText": st.sampled_from(["note", "shared one", "alpha deep", "beta", "gamma"]),
        "queryVector": st.lists(st.floats(-1, 1), min_size=DIM, max_size=DIM).filter(any),
    },
)
bound_keys = st.sampled_from(["k1", "k2", "k3"])


def check_plan(plan: dict[str, Any], galaxy: str, ring: str | None) -> None:
    allowed = known(galaxy) | ({ring} if ring else set())
    for feature in plan["ringFeatures"]:
        assert feature["ring"] in allowed, feature
        assert feature["ringCount"] == COUNTS[galaxy].get(feature["ring"], 0), feature
    assert set(plan["selectedRings"] + plan["prunedRings"]) <= allowed


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(key=bound_keys, body=bodies, route=st.sampled_from(["retrieve", "plan"]))
def test_retrieve_and_plan_stay_in_the_keys_galaxy(
    client: TestClient, key: str, body: dict[str, Any], route: str
) -> None:
    own = KEYS[key]
    assert own is not None
    if route == "retrieve" and "queryText" not in body and "queryVector" not in body:
        body = {**body, "queryText": "note"}
    response = client.post(
        f"/v1/koutendb/{route}", json={"namespace": NS, **body}, headers={"x-api-key": key}
    )
    if body.get("galaxy", own) != own:
        assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
        return
    assert response.status_code == 200, response.text
    out = response.json()
    if route == "plan":
        check_plan(out["plan"], own, body.get("ring"))
        return
    assert out["source"]["galaxy"] == own
    assert {c["id"] for c in out["chunks"]} <= IDS[own]
    assert all(c["sourceUri"].startswith(f"orrery://{NS}/{own}/") for c in out["chunks"])
    assert out["stats"]["totalVectors"] == len(IDS[own])
    check_plan(out["plan"], own, body.get("ring"))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    key=bound_keys,
    galaxy=st.none() | st.sampled_from(GALAXIES),
    route=st.sampled_from(["atlas", "recommendations", "feedback", "profiles"]),
    asked=st.sampled_from(GALAXIES),
)
def test_maps_feedback_and_recommendations_stay_in_the_keys_galaxy(
    client: TestClient,
    envelopes: dict[str, str],
    key: str,
    galaxy: str | None,
    route: str,
    asked: str,
) -> None:
    own = KEYS[key]
    assert own is not None
    headers = {"x-api-key": key}
    params = {"namespace": NS, **({"galaxy": galaxy} if galaxy else {})}
    if route == "feedback":
        response = client.post(
            "/v1/koutendb/feedback",
            json={"namespace": NS, "requestId": envelopes[asked]},
            headers=headers,
        )
        if asked == own:
            assert response.status_code == 200, response.text
        else:
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "unknown_request"
        return
    if route == "profiles":
        response = client.put(
            "/v1/koutendb/profiles/mine", json={"namespace": NS, "amount": "raFew"}, headers=headers
        )
        assert response.status_code == 403
        listed = client.get("/v1/koutendb/profiles", params={"namespace": NS}, headers=headers)
        assert listed.status_code == 200 and "mine" not in str(listed.json())
        return
    response = client.get(f"/v1/koutendb/{route}", params=params, headers=headers)
    if galaxy is not None and galaxy != own:
        assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
        return
    assert response.status_code == 200, response.text
    out = response.json()
    if route == "atlas":
        assert out["galaxyMap"]["galaxy"] == own
        assert out["galaxyMap"]["documents"] == len(IDS[own])
        assert {r["name"] for r in out["ringMap"]} == known(own)
        for ring in out["ringMap"]:
            assert ring["documents"] == COUNTS[own].get(ring["name"], 0)
    else:
        assert out["galaxy"] == own
        # At least this fixture's five envelopes of the galaxy (base ring "", default).
        assert out["recommendations"], out
        for rec in out["recommendations"]:
            assert {r["ring"] for r in rec["rings"]} <= set(COUNTS[own])


# (key, the galaxy its envelopes are kept in, namespace)
TENANTS = {"k1": ("g1", NS), "k2": ("g2", NS), "kb": ("g1", OTHER_NS)}


@settings(
    max_examples=max(10, EXAMPLES // 3),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(sorted(TENANTS)),
            st.sampled_from(["retrieve", "feedback"]),
            st.sampled_from(["req-1", "req-2"]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_the_same_request_id_from_other_tenants_never_touches_an_envelope(
    client: TestClient, steps: list[tuple[str, str, str]]
) -> None:
    """Issue 22, the way it failed: tenant B (another namespace, or another galaxy's
    bound key) retrieving with tenant A's request id never replaces A's envelope: A's
    feedback on its own id still answers 200 with its own chunks, and feedback on an id
    only others used answers `404 unknown_request`."""
    run = uuid.uuid4().hex[:8]
    chunks: dict[tuple[str, str], list[str]] = {}
    for key, action, request_id in steps:
        galaxy, namespace = TENANTS[key]
        rid = f"{run}-{request_id}"
        headers = {"x-api-key": key}
        if action == "retrieve":
            body = {"namespace": namespace, "queryText": "note", "requestId": rid}
            if key == "kb":
                body["galaxy"] = galaxy  # an unbound key names the galaxy of its records
            response = client.post("/v1/koutendb/retrieve", json=body, headers=headers)
            assert response.status_code == 200, response.text
            chunks[(key, request_id)] = [c["id"] for c in response.json()["chunks"]]
            assert chunks[(key, request_id)], "every tenant's retrieve returns chunks"
            continue
        response = client.post(
            "/v1/koutendb/feedback",
            json={
                "namespace": namespace,
                "requestId": rid,
                "usedChunkIds": chunks.get((key, request_id), ["none"])[:1],
            },
            headers=headers,
        )
        if (key, request_id) in chunks:
            assert response.status_code == 200, response.text
            assert response.json()["used"] == 1
        else:
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "unknown_request"


def test_an_unbound_key_names_the_galaxy_of_a_request_id_used_in_two(
    client: TestClient,
) -> None:
    rid = f"{uuid.uuid4().hex[:8]}-twice"
    got = {}
    for galaxy in ("g1", "g2"):
        response = client.post(
            "/v1/koutendb/retrieve",
            json={"namespace": NS, "galaxy": galaxy, "queryText": "note", "requestId": rid},
            headers={"x-api-key": "ka"},
        )
        assert response.status_code == 200, response.text
        got[galaxy] = [c["id"] for c in response.json()["chunks"]]
    feedback = {"namespace": NS, "requestId": rid, "usedChunkIds": got["g2"][:1]}
    ambiguous = client.post("/v1/koutendb/feedback", json=feedback, headers={"x-api-key": "ka"})
    assert ambiguous.status_code == 422, ambiguous.text
    assert ambiguous.json()["error"]["details"]["galaxies"] == ["g1", "g2"]
    named = client.post(
        "/v1/koutendb/feedback", json={**feedback, "galaxy": "g2"}, headers={"x-api-key": "ka"}
    )
    assert named.status_code == 200, named.text
    # The galaxy's own bound key needs no galaxy.
    own = client.post("/v1/koutendb/feedback", json=feedback, headers={"x-api-key": "k2"})
    assert own.status_code == 200, own.text
