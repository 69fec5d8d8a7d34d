"""KoutenDB's retrieval envelope over HTTP, in both deployments (issue 12, scenarios 1–6,
8 and 9; scenario 7, import, is the ingest side's).

One `orrery serve` per deployment (embedded; servers: Kafka, OpenSearch, the Qdrant
server, Redis) with the real embedder. KoutenDB's two-dimensional example vectors are
the first two coordinates of 384-dimensional ones (the rest 0), so cosines are the
examples' own. Each scenario writes its corpus into its own galaxy: ring statistics,
totals and plans are per galaxy.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.koutendb import retrieval_envelope_validation_errors
from contracts.records import derive_document_id
from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import DEPLOYMENTS
from tests.e2e.test_servers_http import server_env

pytestmark = [pytest.mark.slow]

NS = "kouten"
KIND = "objects"
DIM = 384
KEY = "kk"
BOUND = "kb1"  # bound to galaxy s1
API_KEYS = f"{KEY}={NS},{BOUND}={NS}/s1,other=elsewhere"
ADMIN_KEY = "kouten-admin"
H = {"x-api-key": KEY}
BACKEND: dict[int, str] = {}


def vec(a: float, b: float) -> list[float]:
    return [a, b] + [0.0] * (DIM - 2)


def doc(galaxy: str, item: str, ring: str, a: float, b: float) -> dict[str, Any]:
    return {
        "namespace": NS,
        "snapshot_kind": KIND,
        "item_id": item,
        "revision": 1,
        "galaxy": galaxy,
        "ring": ring,
        "payload_schema": "koutendb.raw.v1",
        "payload": {"raw": item},
        "text": {"body": f"{item} in {ring}"},
        "vector": vec(a, b),
    }


def doc_id(galaxy: str, item: str) -> str:
    return derive_document_id(NS, KIND, item, galaxy)


CORPUS = [
    # Scenario 1.
    doc("s1", "ai-a", "ai", 1.0, 0.0),
    doc("s1", "ai-b", "ai", 0.9, 0.1),
    doc("s1", "db-a", "db", 0.0, 1.0),
    # Scenario 2: four vectors over two rings.
    doc("s2", "ai-a", "ai", 1.0, 0.0),
    doc("s2", "ai-b", "ai", 0.9, 0.1),
    doc("s2", "db-a", "db", 0.0, 1.0),
    doc("s2", "db-b", "db", 0.1, 0.9),
    # Scenario 3: a root and two children.
    doc("s3", "japan", "japan", 0.0, 1.0),
    doc("s3", "tokyo", "japan/tokyo", 1.0, 0.0),
    doc("s3", "osaka", "japan/osaka", 0.9, 0.1),
    # Scenario 4: siblings of japan/tokyo, and a ring of another parent.
    doc("s4", "tokyo", "japan/tokyo", 1.0, 0.0),
    doc("s4", "osaka", "japan/osaka", 0.9, 0.1),
    doc("s4", "history", "japan/history", 0.7, 0.3),
    doc("s4", "food", "japan/food", 0.0, 1.0),
    doc("s4", "seoul", "korea/seoul", 0.95, 0.05),
    # Scenario 8: eight documents in one ring.
    *(doc("s8", f"d{i}", "docs", 1.0, 0.1 * i) for i in range(8)),
]


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def kouten(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    env = {"ORRERY_API_KEYS": API_KEYS, "ORRERY_ADMIN_KEY": ADMIN_KEY}
    if request.param == "servers":
        # On PostgreSQL like the other server e2e tests: ring statistics, profiles and
        # kept envelopes in its tables.
        env.update(server_env(run_tag()))
    srv = start_server(Path(tmp_path_factory.mktemp("kouten")) / "data", env=env)
    BACKEND[srv.port] = request.param
    try:
        response = srv.client.post("/v1/records", json=CORPUS, headers=H)
        assert response.status_code == 200, response.text
        srv.wait_projected(documents={(NS, KIND): len(CORPUS)}, headers=H)
        yield srv
    finally:
        srv.stop()


def retrieve(srv: Server, key: str = KEY, **body: Any) -> Any:
    response = srv.client.post(
        "/v1/koutendb/retrieve", json={"namespace": NS, **body}, headers={"x-api-key": key}
    )
    assert response.status_code == 200, response.text
    envelope = response.json()
    assert retrieval_envelope_validation_errors(envelope) == []
    return envelope


def plan(srv: Server, **body: Any) -> Any:
    response = srv.client.post("/v1/koutendb/plan", json={"namespace": NS, **body}, headers=H)
    assert response.status_code == 200, response.text
    return response.json()["plan"]


def error(srv: Server, method: str, path: str, key: str = KEY, **kwargs: Any) -> tuple[int, str]:
    response = srv.client.request(method, path, headers={"x-api-key": key}, **kwargs)
    assert response.status_code >= 400, response.text
    return response.status_code, response.json()["error"]["code"]


def valid(srv: Server, envelope: Any) -> list[str]:
    response = srv.client.post("/v1/koutendb/validate", json=envelope, headers=H)
    assert response.status_code == 200, response.text
    return list(response.json()["errors"])


def test_scenario_1_ring_scoped_envelope(kouten: Server) -> None:
    env = retrieve(kouten, galaxy="s1", queryVector=vec(1, 0), ring="ai", budget=2)
    assert [c["id"] for c in env["chunks"]] == [doc_id("s1", "ai-a"), doc_id("s1", "ai-b")]
    assert [c["payload"] for c in env["chunks"]] == ["ai-a", "ai-b"]
    assert env["chunks"][0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert env["chunks"][0]["sourceUri"] == f"orrery://{NS}/s1/ai/{doc_id('s1', 'ai-a')}"
    features = env["plan"]["ringFeatures"]
    assert len(features) == 1 and features[0]["ring"] == "ai" and features[0]["isBase"]
    assert features[0]["centroidScore"] > 0.9 and features[0]["utility"] > 0
    stats = env["stats"]
    assert (stats["totalVectors"], stats["scanned"], stats["skippedVectors"]) == (3, 2, 1)
    assert stats["candidateReduction"] > 0.3 and stats["returned"] == 2
    assert env["policyHints"]["resourceKind"] == "rag"
    assert env["policyHints"]["resourceScope"] == "topic"
    assert env["plan"]["strategy"] == "ring-scoped" and env["query"]["ringScoped"] is True
    assert env["source"] == {
        "provider": "orrery",
        "galaxy": "s1",
        "ring": "ai",
        "backend": BACKEND[kouten.port],
        "sourceType": "document",
    }
    assert retrieval_envelope_validation_errors(env) == []
    assert valid(kouten, env) == []


def test_scenario_2_global_and_ring_stats(kouten: Server) -> None:
    glob = retrieve(kouten, galaxy="s2", queryVector=vec(1, 0))
    assert glob["plan"]["strategy"] == "global" and glob["plan"]["selectedRings"] == []
    assert glob["stats"]["scanned"] == 4 and glob["stats"]["ringsTouched"] == 2
    assert glob["stats"]["candidateReduction"] == 0
    assert glob["policyHints"]["resourceScope"] == "persistent"
    assert len(glob["chunks"]) == 4
    ring = retrieve(kouten, galaxy="s2", queryVector=vec(1, 0), ring="ai")
    assert ring["stats"]["scanned"] == 2 and ring["stats"]["candidateReduction"] == 0.5
    assert ring["stats"]["payloadBytes"] == 8 and ring["stats"]["estimatedTokens"] == 2
    assert {c["ring"] for c in ring["chunks"]} == {"ai"}


def test_scenario_3_children_only_with_depth(kouten: Server) -> None:
    root = retrieve(kouten, galaxy="s3", queryVector=vec(1, 0), ring="japan")
    assert [c["payload"] for c in root["chunks"]] == ["japan"]
    deep = retrieve(
        kouten,
        galaxy="s3",
        queryVector=vec(1, 0),
        ring="japan",
        amount="raMany",
        scope="ssTight",
        depth="sdDeep",
    )
    assert deep["plan"]["strategy"] == "hierarchical-ring"
    assert deep["chunks"][0]["payload"] == "tokyo"
    assert sorted(c["payload"] for c in deep["chunks"]) == ["japan", "osaka", "tokyo"]
    assert deep["plan"]["selectedRings"] == ["japan", "japan/tokyo", "japan/osaka"]
    descendants = [f for f in deep["plan"]["ringFeatures"] if f["isDescendant"]]
    assert {f["ring"] for f in descendants} == {"japan/tokyo", "japan/osaka"}


def test_scenario_4_siblings_and_pruning(kouten: Server) -> None:
    env = retrieve(kouten, galaxy="s4", queryVector=vec(1, 0), ring="japan/tokyo", scope="ssNear")
    p = env["plan"]
    assert p["selectedRings"] == ["japan/tokyo", "japan/osaka", "japan/history"]
    assert p["prunedRings"] == ["japan/food"]
    assert "korea/seoul" not in p["selectedRings"] + p["prunedRings"]
    assert {c["payload"] for c in env["chunks"]} == {"tokyo", "osaka", "history"}
    siblings = {f["ring"] for f in p["ringFeatures"] if f["isSibling"]}
    assert siblings == {"japan/osaka", "japan/history", "japan/food"}
    assert [f["ring"] for f in p["ringFeatures"]][-1] == "japan/food"


def test_scenario_5_plans(kouten: Server) -> None:
    few = plan(kouten, galaxy="s3", amount="raFew")
    assert (few["budget"], few["strategy"]) == (3, "global")
    wide = plan(kouten, galaxy="s3", ring="japan", amount="raMany", scope="ssWide", depth="sdDeep")
    assert (
        wide["budget"],
        wide["focus"],
        wide["includeChildren"],
        wide["maxDepth"],
        wide["branchBudget"],
        wide["effectiveTopRings"],
    ) == (16, 45, True, 2, 4, 224)
    near = plan(kouten, galaxy="s3", scope="ssNear")
    assert (near["strategy"], near["effectiveTopRings"]) == ("top-rings", 73)
    assert [plan(kouten, galaxy="s3", focus=f)["effectiveTopRings"] for f in (1, 100, 999)] == [
        2,
        500,
        500,
    ]
    assert plan(kouten, galaxy="s3", focus=999)["focus"] == 100
    assert [plan(kouten, galaxy="s3", topRings=t)["effectiveTopRings"] for t in (1, 501)] == [
        2,
        500,
    ]
    assert plan(kouten, galaxy="s3")["profile"] == "default"
    # null means the default profile, as a profile left out does (it was a 422).
    assert plan(kouten, galaxy="s3", profile=None)["profile"] == "default"


def test_scenario_6_validator_messages(kouten: Server) -> None:
    assert valid(kouten, {}) == [
        "schema must be koutendb.retrieval.v1",
        "version must be 1",
        "source must be an object",
        "query must be an object",
        "plan must be an object",
        "chunks must be an array",
        "stats must be an object",
        "policyHints must be an object",
    ]
    assert valid(kouten, []) == ["envelope must be a JSON object"]


def test_scenario_8_recommendations(kouten: Server) -> None:
    tag = run_tag()
    for n in range(5):
        env = retrieve(
            kouten, galaxy="s8", queryVector=vec(1, 0), ring="docs", requestId=f"{tag}-{n}"
        )
        ids = [c["id"] for c in env["chunks"]]
        assert len(ids) == 8 and env["trace"]["requestId"] == f"{tag}-{n}"
        fb = kouten.client.post(
            "/v1/koutendb/feedback",
            json={
                "namespace": NS,
                "requestId": f"{tag}-{n}",
                "usedChunkIds": ids[:2],
                "ignoredChunkIds": ids[2:],
            },
            headers=H,
        )
        assert fb.status_code == 200, fb.text
    response = kouten.client.get(
        "/v1/koutendb/recommendations", params={"namespace": NS, "galaxy": "s8"}, headers=H
    )
    assert response.status_code == 200, response.text
    (rec,) = response.json()["recommendations"]
    assert (rec["baseRing"], rec["profile"], rec["envelopes"]) == ("docs", "default", 5)
    assert (rec["recommendedBudget"], rec["recommendedAmount"]) == (2, "raFew")
    assert rec["usedRatio"] == 0.25 and rec["currentBudget"] == 8
    assert rec["rings"] == [{"ring": "docs", "returned": 40, "used": 10}]
    profiles = kouten.client.get("/v1/koutendb/profiles", params={"namespace": NS}, headers=H)
    default = next(p for p in profiles.json()["profiles"] if p["name"] == "default")
    assert default["tuning"]["budget"] == 8
    # Feedback errors: unknown request, a chunk of no envelope, a chunk in both lists.
    feedback = "/v1/koutendb/feedback"
    assert error(kouten, "POST", feedback, json={"namespace": NS, "requestId": "nope"}) == (
        404,
        "unknown_request",
    )
    assert error(
        kouten,
        "POST",
        feedback,
        json={"namespace": NS, "requestId": f"{tag}-0", "usedChunkIds": ["x"]},
    ) == (422, "unknown_chunk")
    assert error(
        kouten,
        "POST",
        feedback,
        json={
            "namespace": NS,
            "requestId": f"{tag}-0",
            "usedChunkIds": [ids[0]],
            "ignoredChunkIds": [ids[0]],
        },
    ) == (422, "invalid_request")


def test_scenario_9_bound_keys_stay_in_their_galaxy(kouten: Server) -> None:
    env = retrieve(kouten, key=BOUND, queryVector=vec(1, 0))
    assert env["source"]["galaxy"] == "s1"
    assert {c["id"] for c in env["chunks"]} == {doc_id("s1", i) for i in ("ai-a", "ai-b", "db-a")}
    assert env["stats"]["totalVectors"] == 3
    assert error(
        kouten,
        "POST",
        "/v1/koutendb/retrieve",
        key=BOUND,
        json={"namespace": NS, "galaxy": "s2", "queryVector": vec(1, 0)},
    ) == (403, "forbidden")
    assert error(
        kouten, "POST", "/v1/koutendb/plan", key=BOUND, json={"namespace": NS, "galaxy": "s4"}
    ) == (403, "forbidden")
    atlas = kouten.client.get(
        "/v1/koutendb/atlas", params={"namespace": NS}, headers={"x-api-key": BOUND}
    )
    assert atlas.status_code == 200, atlas.text
    assert [r["name"] for r in atlas.json()["ringMap"]] == ["ai", "db"]
    assert error(
        kouten, "GET", "/v1/koutendb/atlas", key=BOUND, params={"namespace": NS, "galaxy": "s3"}
    ) == (403, "forbidden")
    assert error(
        kouten,
        "GET",
        "/v1/koutendb/recommendations",
        key=BOUND,
        params={"namespace": NS, "galaxy": "s8"},
    ) == (403, "forbidden")
    # Another galaxy's envelope is unknown to a bound key.
    other = retrieve(kouten, galaxy="s2", queryVector=vec(1, 0), requestId=uuid.uuid4().hex)
    assert error(
        kouten,
        "POST",
        "/v1/koutendb/feedback",
        key=BOUND,
        json={"namespace": NS, "requestId": other["trace"]["requestId"]},
    ) == (404, "unknown_request")
    assert error(
        kouten, "PUT", "/v1/koutendb/profiles/mine", key=BOUND, json={"namespace": NS}
    ) == (403, "forbidden")
    assert error(
        kouten,
        "POST",
        "/v1/koutendb/retrieve",
        key="other",
        json={"namespace": NS, "queryVector": vec(1, 0)},
    ) == (403, "forbidden")


def test_atlas_maps_rings_with_implied_parents(kouten: Server) -> None:
    response = kouten.client.get(
        "/v1/koutendb/atlas",
        params={"namespace": NS, "galaxy": "s4", "maxCentroidDims": 3},
        headers=H,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["schema"] == "koutendb.atlas.v1" and body["version"] == 1
    assert body["galaxyMap"]["documents"] == 5 and body["galaxyMap"]["rings"] == 7
    rings = {r["name"]: r for r in body["ringMap"]}
    assert rings["japan"]["documents"] == 0 and rings["japan"]["depth"] == 1
    assert rings["japan"]["children"] == [
        "japan/food",
        "japan/history",
        "japan/osaka",
        "japan/tokyo",
    ]
    tokyo = rings["japan/tokyo"]
    assert tokyo["parent"] == "japan" and tokyo["documents"] == 1
    assert tokyo["coherence"] == pytest.approx(1.0) and tokyo["massG"] == pytest.approx(1.0)
    assert tokyo["centroidPreview"] == pytest.approx([1.0, 0.0, 0.0])


def test_profiles_are_kept_per_namespace(kouten: Server) -> None:
    put = kouten.client.put(
        "/v1/koutendb/profiles/wide",
        json={
            "namespace": NS,
            "amount": "raMany",
            "scope": "ssWide",
            "depth": "sdDeep",
            "note": "wider",
        },
        headers=H,
    )
    assert put.status_code == 200, put.text
    assert put.json()["success"] is True and put.json()["name"] == "wide"
    assert put.json()["tuning"] == {
        "budget": 16,
        "focus": 45,
        "topRings": 0,
        "includeChildren": True,
        "maxDepth": 2,
        "branchBudget": 4,
    }
    names = [
        p["name"]
        for p in kouten.client.get(
            "/v1/koutendb/profiles", params={"namespace": NS}, headers=H
        ).json()["profiles"]
    ]
    assert names == ["default", "wide"]
    wide = plan(kouten, galaxy="s3", ring="japan", profile="wide")
    assert (wide["profile"], wide["budget"], wide["strategy"]) == ("wide", 16, "hierarchical-ring")
    # Words of the request override the profile's, numbers override words.
    assert plan(kouten, galaxy="s3", profile="wide", amount="raFew")["budget"] == 3
    assert plan(kouten, galaxy="s3", profile="wide", amount="raFew", budget=5)["budget"] == 5
    # A changed default applies to requests without a profile; deleting it restores it.
    kouten.client.put(
        "/v1/koutendb/profiles/default", json={"namespace": NS, "amount": "raFew"}, headers=H
    )
    assert plan(kouten, galaxy="s3")["budget"] == 3
    deleted = kouten.client.delete(
        "/v1/koutendb/profiles/default", params={"namespace": NS}, headers=H
    )
    assert deleted.status_code == 200, deleted.text
    assert plan(kouten, galaxy="s3")["budget"] == 8
    assert error(
        kouten, "POST", "/v1/koutendb/plan", json={"namespace": NS, "profile": "nope"}
    ) == (422, "unknown_search_profile")
    assert error(
        kouten, "PUT", "/v1/koutendb/profiles/bad", json={"namespace": NS, "amount": "raLots"}
    ) == (422, "invalid_request")
    # Where they live: DATA_DIR/koutendb.sqlite embedded; PostgreSQL in server mode
    # (a query worker keeps nothing on disk).
    if kouten.database_url is None:
        assert (kouten.data_dir / "koutendb.sqlite").exists()
    else:
        import psycopg

        assert not (kouten.data_dir / "koutendb.sqlite").exists()
        with psycopg.connect(kouten.database_url) as conn:
            stored = conn.execute(
                "SELECT name FROM kouten_profiles WHERE namespace = %s", (NS,)
            ).fetchall()
        assert stored == [("wide",)]


def test_request_errors(kouten: Server) -> None:
    path = "/v1/koutendb/retrieve"
    cases = [
        ({"queryVector": vec(1, 0), "surprise": 1}, (422, "unknown_field")),
        ({}, (422, "empty_query")),
        ({"queryVector": [1.0, 0.0]}, (422, "embedder_mismatch")),
        ({"queryVector": vec(1, 0), "scopeRef": "nowhere:current"}, (404, "unknown_scope")),
        ({"queryVector": vec(1, 0), "budget": 0}, (422, "invalid_request")),
        ({"queryVector": vec(1, 0), "budget": 501}, (422, "result_limit_exceeded")),
        ({"queryVector": vec(1, 0), "ring": "a//b"}, (422, "invalid_request")),
        ({"queryVector": vec(1, 0), "amount": "raLots"}, (422, "invalid_request")),
        ({"queryVector": vec(1, 0), "focus": -1}, (422, "invalid_request")),
        ({"queryVector": vec(1, 0), "mode": "lexical"}, (422, "invalid_request")),
    ]
    for body, expected in cases:
        assert error(kouten, "POST", path, json={"namespace": NS, **body}) == expected, body
    # An unknown ring answers no chunks; hybrid and lexical modes rank by text too.
    none = retrieve(kouten, galaxy="s1", queryVector=vec(1, 0), ring="nowhere")
    assert none["chunks"] == [] and none["stats"]["scanned"] == 0
    hybrid = retrieve(kouten, galaxy="s4", queryText="history", ring="japan", depth="sdDeep")
    assert hybrid["query"]["mode"] == "hybrid" and hybrid["chunks"][0]["payload"] == "history"
    lexical = retrieve(kouten, galaxy="s4", queryText="osaka", mode="lexical")
    assert [c["payload"] for c in lexical["chunks"]] == ["osaka"]


def _atlas_counts(srv: Server, galaxy: str) -> tuple[str, dict[str, int]]:
    response = srv.client.get(
        "/v1/koutendb/atlas", params={"namespace": NS, "galaxy": galaxy}, headers=H
    )
    assert response.status_code == 200, response.text
    body = response.json()
    return body["generationId"], {r["name"]: r["documents"] for r in body["ringMap"]}


def _admin(srv: Server, method: str, path: str, **kwargs: Any) -> Any:
    response = srv.client.request(
        method, f"/v1/admin/generations{path}", headers={"x-admin-key": ADMIN_KEY}, **kwargs
    )
    assert response.is_success, response.text
    return response.json()


def test_ring_statistics_follow_writes_and_new_generations(kouten: Server) -> None:
    """Runs last: it rebuilds the scope's generation (same contents)."""
    moved = [doc("s7", f"m{i}", "m", 1.0, 0.1 * i) for i in range(3)]
    assert kouten.client.post("/v1/records", json=moved, headers=H).status_code == 200
    total = len(CORPUS) + 3
    kouten.wait_projected(documents={(NS, KIND): total}, headers=H)
    _, counts = _atlas_counts(kouten, "s7")
    assert counts == {"m": 3}
    # One document moves to ring n with another vector, one is deleted.
    update = {**doc("s7", "m1", "n", 0.0, 1.0), "revision": 2}
    tombstone = {
        "namespace": NS,
        "snapshot_kind": KIND,
        "item_id": "m2",
        "galaxy": "s7",
        "revision": 2,
        "deleted": True,
    }
    assert kouten.client.post("/v1/records", json=[update, tombstone], headers=H).status_code == 200
    kouten.wait_projected(documents={(NS, KIND): total - 1}, headers=H)
    live, counts = _atlas_counts(kouten, "s7")
    assert counts == {"m": 1, "n": 1}
    env = retrieve(kouten, galaxy="s7", queryVector=vec(0, 1), ring="n")
    assert [c["payload"] for c in env["chunks"]] == ["m1"]
    assert env["plan"]["ringFeatures"][0]["centroidScore"] == pytest.approx(1.0, abs=1e-6)
    # A new generation (the embedded build loads in a child process) has the same
    # statistics from its own load.
    built = _admin(kouten, "POST", "/build", json={"namespace": NS, "snapshot_kind": KIND})["row"][
        "generation_id"
    ]
    deadline = time.monotonic() + 180
    while (view := _admin(kouten, "GET", f"/{built}"))["row"]["state"] == "building":
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    assert view["row"]["state"] == "sealed", view
    assert _admin(kouten, "POST", f"/{built}/verify")["verified"]
    _admin(kouten, "POST", f"/{built}/promote")
    generation, rebuilt = _atlas_counts(kouten, "s7")
    assert generation == built != live
    assert rebuilt == {"m": 1, "n": 1}
    env = retrieve(kouten, galaxy="s1", queryVector=vec(1, 0), ring="ai", budget=2)
    assert (env["stats"]["totalVectors"], env["stats"]["scanned"]) == (3, 2)
