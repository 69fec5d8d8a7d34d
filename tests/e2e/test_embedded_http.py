"""End to end over HTTP against a real `orrery serve` (embedded stack, real embedder)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from contracts.records import derive_document_id
from tests.e2e.conftest import Server, start_server

NS = "e2e"
SCOPE = "longterm:objects:current"


def rec(item: str, revision: int = 1, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespace": fields.pop("namespace", NS),
        "snapshot_kind": fields.pop("snapshot_kind", "objects"),
        "item_id": item,
        "revision": revision,
        "payload_schema": "twinr_memory_object_record_v2",
        "payload": {"memory_id": item, "summary": fields.get("body", "")},
        "text": {
            "title": fields.pop("title", ""),
            "body": fields.pop("body", ""),
            "tags": fields.pop("tags", []),
        },
        "metadata": {
            "status": fields.pop("status", "active"),
            "updated_at": fields.pop("updated_at", "2026-03-19T12:00:00Z"),
            "visibility": fields.pop("visibility", ["family"]),
        },
    }
    body.update(fields)
    return body


CORPUS = [
    rec(
        "fact:thermos_location_old",
        title="Rote Thermoskanne im Flurschrank",
        body="Früher stand deine rote Thermoskanne im Flurschrank.",
    ),
    rec(
        "fact:thermos_location_new",
        title="Thermoskanne im Küchenregal",
        body="Die rote Thermoskanne steht jetzt im Küchenregal neben dem Tee.",
        updated_at="2026-10-01T08:00:00Z",
    ),
    rec("fact:keys", title="House keys", body="The spare house keys hang on the hook by the door."),
    rec(
        "fact:glasses",
        title="Reading glasses",
        body="Margarete keeps her reading glasses in the blue case on the nightstand.",
        status="candidate",
    ),
    rec(
        "fact:umbrella",
        title="Umbrella",
        body="The big umbrella is in the car boot.",
        status="superseded",
    ),
    rec(
        "fact:pin",
        title="Bank PIN hint",
        body="The hint for the bank card is in the safe.",
        visibility=["private"],
    ),
    rec(
        "fact:garden",
        title="Garden hose",
        body="The garden hose is coiled behind the shed.",
        galaxy="anna",
    ),
]


@pytest.fixture(scope="module")
def loaded(server: Server) -> Server:
    response = server.post_records(CORPUS)
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == len(CORPUS)
    server.wait_projected()
    return server


def ids(response: Any) -> list[str]:
    return [r["item_id"] for r in response.json()["results"]]


def test_exact_title_ranks_first(loaded: Server) -> None:
    response = loaded.topk(
        namespace=NS, scope_ref=SCOPE, query_text="Reading glasses", result_limit=3
    )
    assert response.status_code == 200, response.text
    assert ids(response)[0] == "fact:glasses"


def test_seed_question_finds_the_old_thermos_location(loaded: Server) -> None:
    response = loaded.topk(
        namespace=NS,
        scope_ref=SCOPE,
        query_text="Wo stand früher meine rote Thermoskanne?",
        result_limit=6,
    )
    assert ids(response)[0] == "fact:thermos_location_old"


def test_response_shape_and_plan(loaded: Server) -> None:
    body = loaded.topk(
        namespace=NS,
        scope_ref=SCOPE,
        query_text="umbrella car",
        result_limit=2,
        client_request_id="req-1",
    ).json()
    assert body["success"] is True and body["scope_ref"] == SCOPE
    assert body["client_request_id"] == "req-1"
    assert body["profile"] == "weighted@3" and body["generation_id"].startswith("g")
    first = body["results"][0]
    assert set(first) >= {
        "rank",
        "document_id",
        "item_id",
        "payload_schema",
        "payload",
        "metadata",
        "score",
        "score_breakdown",
    }
    assert set(first["score_breakdown"]) == {"lexical", "vector", "freshness", "metadata"}
    plan = body["query_plan"]
    assert plan["candidate_scope_mode"] == "scope_ref"
    assert plan["generation_id"] == body["generation_id"]
    assert {"bm25", "vector"} <= set(plan["indexes_used"])
    assert plan["candidate_count"] >= len(body["results"])
    latency = plan["latency_ms"]
    stages = ["scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize"]
    assert all(latency[s] >= 0 for s in stages)
    assert sum(latency[s] for s in stages) <= latency["total"] + 0.01
    # Both sources were searched; their time is part of the stages that called them. This
    # generation is small and was only added to: its vectors and its text are scored from
    # the in-memory copies, not by qdrant-edge and tantivy.
    engine = plan["engine_ms"]
    assert {"flat_lexical", "flat_vectors"} <= set(engine)
    assert "tantivy_search" not in engine
    assert "qdrant_edge_query" not in engine
    # Document ids are UUIDs: every hit is read from fast fields, none from its document.
    assert "tantivy_doc_reads" not in engine
    assert all(ms > 0 for ms in engine.values())
    assert sum(engine.values()) <= latency["index_search"] + latency["rerank"] + 0.01


def test_include_flags_drop_parts(loaded: Server) -> None:
    body = loaded.topk(
        namespace=NS,
        scope_ref=SCOPE,
        query_text="keys",
        include={
            "payload": False,
            "metadata": False,
            "content": True,
            "score_breakdown": False,
            "query_plan": False,
        },
    ).json()
    first = body["results"][0]
    assert first["payload"] is None and first["metadata"] is None
    assert first["score_breakdown"] is None and body["query_plan"] is None
    assert first["content"]["title"] == "House keys"


def test_status_filter_applies_before_scoring(loaded: Server) -> None:
    response = loaded.topk(
        namespace=NS,
        scope_ref=SCOPE,
        query_text="umbrella car boot",
        filters={"status": ["active", "candidate"]},
        result_limit=10,
    )
    assert "fact:umbrella" not in ids(response)
    assert ids(response)  # other documents still come back


def test_visibility_and_galaxy_filters(loaded: Server) -> None:
    private = loaded.topk(
        namespace=NS,
        scope_ref=SCOPE,
        query_text="bank card hint",
        filters={"visibility": ["family"]},
        result_limit=10,
    )
    assert "fact:pin" not in ids(private)
    anna = loaded.topk(
        namespace=NS,
        scope_ref=SCOPE,
        query_text="garden hose",
        filters={"galaxy": "anna"},
        result_limit=10,
    )
    assert ids(anna) == ["fact:garden"]
    default = loaded.topk(
        namespace=NS,
        scope_ref=SCOPE,
        query_text="garden hose",
        filters={"galaxy": "default"},
        result_limit=10,
    )
    assert "fact:garden" not in ids(default)


def test_filter_only_query(loaded: Server) -> None:
    response = loaded.topk(
        namespace=NS, scope_ref=SCOPE, query_text="", filters={"status": ["candidate"]}
    )
    assert ids(response) == ["fact:glasses"]


def test_payload_round_trip(loaded: Server) -> None:
    payload = {
        "memory_id": "fact:roundtrip",
        "nested": {"ä": [1, 2.5, None, True]},
        "text": "Grüße 🌍",
        "big": 12345678901234567,
    }
    record = rec("fact:roundtrip", title="Roundtrip marker zebra", body="zebra marker")
    record["payload"] = payload
    assert loaded.post_records([record]).status_code == 200
    loaded.wait_projected()
    result = loaded.topk(
        namespace=NS, scope_ref=SCOPE, query_text="roundtrip zebra marker", result_limit=1
    ).json()["results"][0]
    assert result["item_id"] == "fact:roundtrip"
    assert result["payload"] == payload
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert result["metadata"]["payload_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert result["metadata"]["updated_at"].startswith("2026-03-19T12:00:00")


def test_update_and_delete(loaded: Server) -> None:
    loaded.post_records([rec("fact:vase", title="Vase", body="The green vase is on the shelf.")])
    loaded.wait_projected()
    loaded.post_records(
        [rec("fact:vase", 2, title="Vase", body="The green vase is now on the windowsill.")]
    )
    loaded.wait_projected()
    result = loaded.topk(
        namespace=NS, scope_ref=SCOPE, query_text="green vase", result_limit=1
    ).json()["results"][0]
    assert result["item_id"] == "fact:vase" and result["metadata"]["revision"] == 2
    assert "windowsill" in result["payload"]["summary"]
    tombstone = rec("fact:vase", 3, title="Vase", body="")
    tombstone["deleted"] = True
    assert loaded.post_records([tombstone]).status_code == 200
    loaded.wait_projected()
    response = loaded.topk(namespace=NS, scope_ref=SCOPE, query_text="green vase windowsill")
    assert "fact:vase" not in ids(response)


def test_wait_searchable_answers_when_a_query_finds_the_write(loaded: Server) -> None:
    """`?wait=searchable`: once the POST answers, the very next query sees the records
    (no readiness polling), and a tombstone written the same way is gone at once."""
    record = rec("fact:kite", title="Kite", body="The red kite hangs in the garage loft.")
    response = loaded.client.post("/v1/records", json=[record], params={"wait": "searchable"})
    assert response.status_code == 200, response.text
    assert response.json()["searchable"] is True
    hits = loaded.topk(namespace=NS, scope_ref=SCOPE, query_text="red kite garage loft")
    assert ids(hits)[0] == "fact:kite"
    tombstone = rec("fact:kite", 2, title="Kite", body="")
    tombstone["deleted"] = True
    response = loaded.client.post("/v1/records", json=[tombstone], params={"wait": "searchable"})
    assert response.json()["searchable"] is True
    hits = loaded.topk(namespace=NS, scope_ref=SCOPE, query_text="red kite garage loft")
    assert "fact:kite" not in ids(hits)
    # Without the parameter the answer keeps its shape.
    plain = loaded.post_records([rec("fact:kite", 3, title="Kite", body="Back on the wall.")])
    assert "searchable" not in plain.json()


def test_revision_conflict_is_per_record(loaded: Server) -> None:
    response = loaded.post_records(
        [
            rec("fact:keys", 1, title="House keys", body="stale"),
            rec("fact:conflict-new", 1, title="new one", body="new"),
        ]
    )
    assert response.status_code == 200
    body = response.json()
    assert body["accepted"] == 1 and body["rejected"] == 1
    stale, fresh = body["items"]
    assert stale["status"] == 409 and stale["error"]["code"] == "revision_conflict"
    assert fresh["status"] == 201 and fresh["position"] > 0
    only_stale = loaded.post_records([rec("fact:keys", 1, title="House keys", body="stale")])
    assert only_stale.status_code == 409
    assert only_stale.json()["error"]["code"] == "revision_conflict"


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/external/retrieve/topk_records", b"{not json", 400, "invalid_json"),
        (
            "/v1/external/retrieve/topk_records",
            {"namespace": NS, "scope_ref": SCOPE, "query_text": "x", "result_limit": "many"},
            422,
            "invalid_request",
        ),
        (
            "/v1/external/retrieve/topk_records",
            {"namespace": NS, "scope_ref": "longterm:nothing:current", "query_text": "x"},
            404,
            "unknown_scope",
        ),
        (
            "/v1/external/retrieve/topk_records",
            {"namespace": NS, "scope_ref": SCOPE, "query_text": "x", "colour": "red"},
            422,
            "unknown_field",
        ),
        (
            "/v1/external/retrieve/topk_records",
            {"namespace": NS, "scope_ref": SCOPE, "query_text": "x", "result_limit": 10_000},
            422,
            "result_limit_exceeded",
        ),
        (
            "/v1/external/retrieve/topk_records",
            {"namespace": NS, "scope_ref": SCOPE, "query_text": "   "},
            422,
            "empty_query",
        ),
        (
            "/v1/external/retrieve/topk_records",
            {"namespace": "nobody", "scope_ref": SCOPE, "query_text": "x"},
            404,
            "unknown_namespace",
        ),
        ("/v1/records", b"[1,", 400, "invalid_json"),
        ("/v1/records", {"not": "a list"}, 422, "invalid_request"),
        ("/v1/records", [], 422, "invalid_request"),
        ("/v1/records", [{"namespace": NS}], 422, "invalid_request"),
        ("/v1/records", [{**rec("fact:x"), "surprise": True}], 422, "unknown_field"),
        ("/v1/records", [{**rec("fact:x"), "vector": [0.1, 0.2]}], 422, "invalid_request"),
    ],
)
def test_bad_input(loaded: Server, path: str, body: Any, status: int, code: str) -> None:
    if isinstance(body, bytes):
        response = loaded.client.post(
            path, content=body, headers={"content-type": "application/json"}
        )
    else:
        response = loaded.client.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["success"] is False
    assert error["error"]["code"] == code
    assert error["error"]["message"]


def test_oversized_batch_is_rejected_and_nothing_written(loaded: Server) -> None:
    batch = [rec(f"fact:bulk-{i}", title="bulk") for i in range(1_001)]
    response = loaded.post_records(batch)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "batch_too_large"
    ok = loaded.post_records([rec("fact:bulk-0", title="bulk")])
    assert ok.json()["accepted"] == 1  # revision 1 was never stored


def test_invalid_record_rejects_whole_batch(loaded: Server) -> None:
    response = loaded.post_records([rec("fact:valid-one"), {**rec("fact:bad"), "revision": -1}])
    assert response.status_code == 422
    assert response.json()["error"]["details"]["records"][0]["index"] == 1
    ok = loaded.post_records([rec("fact:valid-one")])
    assert ok.json()["accepted"] == 1


def test_generic_retrieve_and_split_path(loaded: Server) -> None:
    ids_body = loaded.client.get(
        "/v1/scopes/document_ids", params={"namespace": NS, "scope_ref": SCOPE}
    ).json()
    doc_ids = ids_body["document_ids"]
    assert len(doc_ids) >= len(CORPUS) - 1
    ranked = loaded.client.post(
        "/v1/external/retrieve",
        json={
            "namespace": NS,
            "scope_ref": SCOPE,
            "query_text": "house keys hook",
            "limit": 3,
            "allowed_doc_ids": doc_ids,
        },
    ).json()
    assert ranked["query_plan"]["candidate_scope_mode"] == "allowed_doc_ids"
    top_ids = [c["document_id"] for c in ranked["candidates"]]
    hydrated = loaded.client.post(
        "/v1/records/by_id", json={"namespace": NS, "document_ids": top_ids}
    ).json()
    assert hydrated["records"][0]["item_id"] == "fact:keys"
    assert hydrated["missing"] == []


def test_readiness_reports_lag_and_generation(loaded: Server) -> None:
    ready = loaded.wait_projected()
    scope = next(s for s in ready["scopes"] if s["namespace"] == NS)
    assert scope["snapshot_kind"] == "objects" and scope["lag_events"] == 0
    assert scope["document_count"] >= len(CORPUS)
    assert ready["projector"]["running"] is True


def test_restart_keeps_data_and_generation(tmp_path: Path) -> None:
    first = start_server(tmp_path / "data")
    try:
        first.post_records(CORPUS)
        first.wait_projected()
        before = first.topk(namespace=NS, scope_ref=SCOPE, query_text="house keys").json()
    finally:
        first.stop()
    second = start_server(tmp_path / "data")
    try:
        after = second.topk(namespace=NS, scope_ref=SCOPE, query_text="house keys").json()
        assert after["generation_id"] == before["generation_id"]
        assert [r["document_id"] for r in after["results"]] == [
            r["document_id"] for r in before["results"]
        ]
    finally:
        second.stop()


def test_api_keys_scope_namespace_and_galaxy(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "data", env={"ORRERY_API_KEYS": "k-all=e2e,k-anna=e2e/anna"})
    try:
        assert srv.post_records(CORPUS).status_code == 401
        ok = srv.client.post("/v1/records", json=CORPUS, headers={"x-api-key": "k-all"})
        assert ok.status_code == 200
        assert srv.client.get("/v1/readiness").status_code == 401
        ready = srv.wait_projected(headers={"x-api-key": "k-all"})
        assert {s["namespace"] for s in ready["scopes"]} == {NS}
        assert "projector" not in ready
        anna_ready = srv.client.get("/v1/readiness", headers={"x-api-key": "k-anna"}).json()
        assert anna_ready["scopes"] and all("document_count" not in s for s in anna_ready["scopes"])
        body = {
            "namespace": NS,
            "scope_ref": SCOPE,
            "query_text": "garden hose house keys",
            "result_limit": 10,
        }
        anna = srv.client.post(
            "/v1/external/retrieve/topk_records",
            json=body,
            headers={"authorization": "Bearer k-anna"},
        )
        assert [r["item_id"] for r in anna.json()["results"]] == ["fact:garden"]
        widen = srv.client.post(
            "/v1/external/retrieve/topk_records",
            json={**body, "filters": {"galaxy": "default"}},
            headers={"x-api-key": "k-anna"},
        )
        assert widen.status_code == 403 and widen.json()["error"]["code"] == "forbidden"
        other = srv.client.post(
            "/v1/external/retrieve/topk_records",
            json={**body, "namespace": "other"},
            headers={"x-api-key": "k-all"},
        )
        assert other.status_code == 403
        # The ChonkyDB dialect infers a scope from allowed ids within the key's galaxy
        # only: another galaxy's id (of another kind here) counts like an unknown one.
        conflict = rec("conflict:keys", snapshot_kind="conflicts", title="Keys?", body="door")
        written = srv.client.post("/v1/records", json=[conflict], headers={"x-api-key": "k-all"})
        assert written.status_code == 200
        garden_id = derive_document_id(NS, "objects", "fact:garden", "anna")
        conflict_id = derive_document_id(NS, "conflicts", "conflict:keys")
        srv.wait_projected(headers={"x-api-key": "k-all"})
        chonky = {"mode": "advanced", "query_text": "garden hose keys", "result_limit": 5}
        mixed = srv.client.post(
            "/v1/external/retrieve",
            json={**chonky, "allowed_doc_ids": [conflict_id, garden_id]},
            headers={"x-api-key": "k-anna"},
        )
        assert mixed.status_code == 200, mixed.text
        assert [r["payload_id"] for r in mixed.json()["results"]] == [garden_id]
        foreign = srv.client.post(
            "/v1/external/retrieve",
            json={**chonky, "allowed_doc_ids": [conflict_id]},
            headers={"x-api-key": "k-anna"},
        )
        assert foreign.status_code == 200 and foreign.json()["results"] == []
    finally:
        srv.stop()


def test_response_cache_hits_and_is_invalidated_by_writes(loaded: Server) -> None:
    body = {
        "namespace": NS,
        "scope_ref": SCOPE,
        "query_text": "spare house keys door",
        "result_limit": 3,
    }
    first = loaded.topk(**body, client_request_id="a").json()
    second = loaded.topk(**body, client_request_id="b").json()
    assert second["query_plan"]["cache"] == "hit"
    assert second["query_plan"]["engine_ms"] == {}
    assert second["client_request_id"] == "b"
    assert second["results"] == first["results"]
    loaded.post_records(
        [
            rec(
                "fact:doorbell",
                title="Doorbell keys",
                body="The doorbell battery sits next to the spare house keys.",
            )
        ]
    )
    loaded.wait_projected()
    third = loaded.topk(**body).json()
    assert third["query_plan"]["cache"] == "miss"
    assert third["query_plan"]["applied_position"] > first["query_plan"]["applied_position"]
    assert "fact:doorbell" in [r["item_id"] for r in third["results"]]


def test_chonkydb_record_reads_without_api_keys_need_no_namespace(loaded: Server) -> None:
    """Without API keys (an open instance, as ChonkyDB's facade is), Twinr's record
    reads — which never send a namespace — find a record by its id in any namespace;
    a `twinr://longterm/<namespace>/…` uri names its own namespace."""
    namespace = "twinr_longterm_v1:open:abc123"
    uri = "twinr://longterm/twinr_longterm_v1%3Aopen%3Aabc123/objects/fact:open"
    bulk = loaded.client.post(
        "/v1/external/records/bulk",
        json={
            "items": [
                {
                    "payload": {"memory_id": "fact:open", "summary": "an open instance"},
                    "metadata": {"twinr_namespace": namespace, "twinr_snapshot_kind": "objects"},
                    "uri": uri,
                }
            ]
        },
    )
    assert bulk.status_code == 200, bulk.text
    doc_id = bulk.json()["items"][0]["document_id"]
    record = loaded.client.get(f"/v1/external/records/{doc_id}")
    assert record.status_code == 200, record.text
    assert record.json()["payload"]["memory_id"] == "fact:open"
    assert record.json()["origin_uri"] == uri
    full = loaded.client.get("/v1/external/documents/full", params={"origin_uri": uri})
    assert full.status_code == 200, full.text
    assert full.json()["document_id"] == doc_id
    listed = loaded.client.get("/v1/external/records", params={"limit": 1000}).json()
    assert listed["namespace"] is None
    ids = {p["document_id"] for p in listed["payloads"]}
    assert doc_id in ids and listed["total_count"] > 1  # the corpus's too
    # `?namespace=` still narrows: another namespace does not see the record.
    other = loaded.client.get(f"/v1/external/records/{doc_id}", params={"namespace": "demo"})
    assert other.status_code == 404
    narrowed = loaded.client.get("/v1/external/records", params={"namespace": namespace}).json()
    assert [p["document_id"] for p in narrowed["payloads"]] == [doc_id]
