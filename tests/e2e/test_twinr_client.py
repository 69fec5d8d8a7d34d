"""Twinr's own ChonkyDB client, unchanged, against a running `orrery serve` (embedded).

The client comes from `../shared/clients/twinr-chonkydb/` (reference material, not
project code); without it the suite skips locally and fails when
`ORRERY_REQUIRE_SERVERS=1` (CI). Every method Twinr's long-term memory uses runs over
real HTTP and the assertions are what Twinr reads back: payloads, ids, ranks,
`query_plan`; the parsed models are the client's own (its recorded shapes).
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.records import derive_document_id
from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import DEPLOYMENTS
from tests.e2e.test_servers_http import server_env

pytestmark = [pytest.mark.slow]

CLIENT_DIR = Path(__file__).resolve().parents[3] / "shared" / "clients" / "twinr-chonkydb"
if not CLIENT_DIR.is_dir():
    CLIENT_DIR = Path("/work/shared/clients/twinr-chonkydb")
API_KEY = "twinr-key"
NAMESPACE = "twinr_longterm_v1.home"
SCOPES = {
    "longterm:objects:current": "objects",
    "longterm:conflicts:current": "conflicts",
    "longterm:archive:current": "archive",
    "longterm:midterm:current": "midterm",
    "longterm:graph_nodes:current": "graph_nodes",
}


def _import_client() -> Any:
    if not CLIENT_DIR.is_dir():
        if os.environ.get("ORRERY_REQUIRE_SERVERS", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"Twinr's client is missing at {CLIENT_DIR}")
        pytest.skip(f"Twinr's client is missing at {CLIENT_DIR}")
    # client.py imports TwinrConfig only for from_twinr_config; a stub module stands in.
    stub = types.ModuleType("twinr.agent.base_agent.config")
    stub.TwinrConfig = type("TwinrConfig", (), {})  # type: ignore[attr-defined]
    sys.modules.setdefault("twinr.agent.base_agent.config", stub)
    if str(CLIENT_DIR) not in sys.path:
        sys.path.insert(0, str(CLIENT_DIR))
    from twinr.memory.chonkydb import client, models

    return client, models


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def twinr(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Any, Server]]:
    """Twinr's client against both deployments (server mode: Kafka, OpenSearch, the
    Qdrant server, Redis)."""
    client_mod, models = _import_client()
    env = {"ORRERY_API_KEYS": f"{API_KEY}={NAMESPACE}"}
    if request.param == "servers":
        env.update(server_env(run_tag()))
    srv = start_server(tmp_path_factory.mktemp("twinr") / "data", env=env)
    config = models.ChonkyDBConnectionConfig(
        base_url=f"http://127.0.0.1:{srv.port}", api_key=API_KEY, timeout_s=30.0
    )
    yield client_mod.ChonkyDBClient(config), models, srv
    srv.stop()


def _item(models: Any, kind: str, memory_id: str, summary: str, **meta: Any) -> Any:
    return models.ChonkyDBRecordItem(
        payload={"memory_id": memory_id, "kind": "fact", "summary": summary, "status": "active"},
        metadata={
            "twinr_namespace": NAMESPACE,
            "twinr_snapshot_kind": kind,
            "status": "active",
            "updated_at": "2026-03-19T12:00:00Z",
            **meta,
        },
        content=summary,
    )


def _wait(srv: Server) -> None:
    srv.wait_projected(headers={"x-api-key": API_KEY})


def test_twinr_client_long_term_path(twinr: tuple[Any, Any, Server]) -> None:
    client, models, srv = twinr

    info = client.instance()
    assert info.success and info.service == "orrery" and info.auth_enabled

    # Sync bulk write: one item per scope, plus a second object.
    written = client.store_records_bulk(
        models.ChonkyDBBulkRecordRequest(
            items=(
                _item(models, "objects", "fact:thermos", "Die rote Thermoskanne im Flurschrank"),
                _item(models, "objects", "fact:keys", "The spare keys hang by the door"),
                _item(models, "conflicts", "conflict:keys", "Keys: door or drawer?"),
                _item(models, "archive", "fact:old_thermos", "Früher stand die Thermoskanne"),
                _item(models, "midterm", "packet:keys", "Asked twice today where the keys are"),
                _item(models, "graph_nodes", "node:thermos", "Thermoskanne, red, hall cupboard"),
            ),
            client_request_id="bulk-1",
        )
    )
    assert written["success"] and written["succeeded"] == 6
    thermos_id = derive_document_id(NAMESPACE, "objects", "fact:thermos")
    assert written["items"][0]["payload_id"] == thermos_id
    assert written["items"][0]["document_id"] == thermos_id

    # Async bulk write: accepted, then done with the written document ids.
    accepted = client.store_records_bulk(
        models.ChonkyDBBulkRecordRequest(
            items=(_item(models, "objects", "fact:glasses", "Glasses are on the desk"),),
            execution_mode="async",
        )
    )
    assert accepted["status"] == "accepted"
    deadline = time.monotonic() + 30
    while (job := client.job_status(accepted["job_id"]))["status"] != "done":
        assert job["status"] in {"accepted", "running"} and time.monotonic() < deadline
        time.sleep(0.05)
    glasses_id = derive_document_id(NAMESPACE, "objects", "fact:glasses")
    assert job["document_ids"] == [glasses_id]
    _wait(srv)
    assert client.instance().ready

    # topk_records for each scope ref, as Twinr sends it.
    for scope_ref, kind in SCOPES.items():
        out = client.topk_records(
            models.ChonkyDBTopKRecordsRequest(
                query_text="Thermoskanne keys",
                result_limit=5,
                namespace=NAMESPACE,
                scope_ref=scope_ref,
            )
        )
        assert out.success and out.scope_ref == scope_ref
        assert out.results, scope_ref
        assert all(h.metadata["twinr_snapshot_kind"] == kind for h in out.results)
        assert out.query_plan is not None and "latency_ms" in out.query_plan
        assert [h.raw["rank"] for h in out.results] == list(range(1, len(out.results) + 1))
    top = client.topk_records(
        models.ChonkyDBTopKRecordsRequest(
            query_text="rote Thermoskanne",
            result_limit=2,
            namespace=NAMESPACE,
            scope_ref="longterm:objects:current",
            allowed_indexes=("ccodex_memory_fulltext", "ccodex_memory_vector_768"),
        )
    )
    assert top.results[0].document_id == thermos_id
    assert top.results[0].payload_id == thermos_id
    assert top.results[0].payload["memory_id"] == "fact:thermos"
    assert top.results[0].score_breakdown is not None
    assert top.query_plan["candidate_scope_mode"] == "scope_ref"

    # The by-id call: exactly the ids asked for, in order, unknown ids left out.
    by_id = client.topk_records(
        models.ChonkyDBTopKRecordsRequest(
            query_text="__allowed_doc_ids__",
            result_limit=10,
            allowed_doc_ids=(glasses_id, "unknown-id", thermos_id),
        )
    )
    assert [h.document_id for h in by_id.results] == [glasses_id, thermos_id]
    assert by_id.results[1].payload["summary"].startswith("Die rote")
    assert by_id.query_plan["candidate_scope_mode"] == "allowed_doc_ids"

    # retrieve in ChonkyDB's shape: results[] with payload_id and metadata.
    hits = client.retrieve(
        models.ChonkyDBRetrieveRequest(
            query_text="spare keys",
            result_limit=3,
            extra={"namespace": NAMESPACE, "scope_ref": "longterm:objects:current"},
        )
    )
    assert hits.success and hits.mode == "advanced"
    assert hits.results[0].payload_id == derive_document_id(NAMESPACE, "objects", "fact:keys")
    assert hits.results[0].metadata["twinr_snapshot_kind"] == "objects"
    assert hits.indexes_used

    # Records: list, get, full document.
    listed = client.list_records(limit=2)
    assert listed.total_count == 7 and listed.returned_count == 2
    record = client.get_record(thermos_id)
    assert record["payload"]["memory_id"] == "fact:thermos"
    full = client.fetch_full_document(document_id=thermos_id, include_content=False)
    assert full["document_id"] == thermos_id and full["content"] is None

    # Delete: the record disappears from reads and from ranking.
    deleted = client.delete_record(glasses_id)
    assert deleted["deleted"] is True
    with pytest.raises(Exception) as missing:
        client.get_record(glasses_id)
    assert getattr(missing.value, "status_code", None) == 404
    _wait(srv)
    assert client.list_records().total_count == 6


def test_unknown_fields_fail_loudly_in_orrerys_shape(twinr: tuple[Any, Any, Server]) -> None:
    client, _models, _srv = twinr
    with pytest.raises(Exception) as failed:
        client.topk_records(
            {"mode": "advanced", "query_text": "x", "namespace": NAMESPACE, "bogus": 1}
        )
    assert getattr(failed.value, "status_code", None) == 422
    assert failed.value.response_json["error"]["code"] == "unknown_field"  # type: ignore[attr-defined]


def _meds(models: Any, memory_id: str, note: str) -> Any:
    return models.ChonkyDBRecordItem(
        payload={"memory_id": memory_id, "note": note},
        metadata={"twinr_namespace": NAMESPACE, "twinr_snapshot_kind": "objects", "idx": 1},
        content=note,
        tags=("health", "reminder"),
    )


def test_recorded_shapes_parse_from_live_answers(twinr: tuple[Any, Any, Server]) -> None:
    """Every response shape Twinr's client tests record (`test_chonkydb.py` in
    ../shared, fed there by a fake opener), asserted as those tests assert it, on
    Orrery's live answers. Where a recorded test checks only the request it sends, the
    live check is that Orrery answers that request."""
    client, models, srv = twinr
    client_mod = sys.modules["twinr.memory.chonkydb.client"]
    base_url = f"http://127.0.0.1:{srv.port}"

    # test_instance_and_auth_use_x_api_key_header: the key travels as x-api-key.
    instance = client.instance()
    auth = client.auth_info()
    assert instance.success and isinstance(instance.ready, bool)
    assert instance.service == "orrery" and instance.auth_enabled is True
    assert auth.success and auth.scheme == "api_key" and auth.header_name == "x-api-key"
    assert auth.allow_bearer is True and auth.api_key_configured is True
    anonymous = client_mod.ChonkyDBClient(models.ChonkyDBConnectionConfig(base_url=base_url))
    with pytest.raises(client_mod.ChonkyDBError) as refused:
        anonymous.instance()
    assert refused.value.status_code == 401
    assert refused.value.response_json["error"]["code"] == "unauthorized"

    # test_bearer_auth_header_is_supported.
    bearer = client_mod.ChonkyDBClient(
        models.ChonkyDBConnectionConfig(base_url=base_url, api_key=API_KEY, allow_bearer_auth=True)
    )
    assert bearer.instance().success

    # test_store_request_and_bulk_request_encode_cleanly: store_record (one item through
    # records/bulk) and store_records_bulk, with client_request_id.
    stored = client.store_record(
        models.ChonkyDBRecordRequest(
            payload={"memory_id": "fact:meds", "note": "Bring medication"},
            metadata={"twinr_namespace": NAMESPACE, "twinr_snapshot_kind": "objects"},
            tags=("health", "reminder"),
            client_request_id="req-1",
        )
    )
    assert stored["success"] and stored["count"] == 1
    assert stored["client_request_id"] == "req-1"
    bulk = client.store_records_bulk(
        models.ChonkyDBBulkRecordRequest(
            items=(
                _meds(models, "fact:walk", "A short walk after lunch"),
                _meds(models, "fact:tea", "Peppermint tea in the evening"),
            ),
            client_request_id="bulk-1",
        )
    )
    assert bulk["success"] and bulk["count"] == 2 and bulk["client_request_id"] == "bulk-1"
    meds_id = derive_document_id(NAMESPACE, "objects", "fact:meds")
    walk_id = derive_document_id(NAMESPACE, "objects", "fact:walk")
    tea_id = derive_document_id(NAMESPACE, "objects", "fact:tea")
    assert [i["payload_id"] for i in bulk["items"]] == [walk_id, tea_id]
    _wait(srv)

    # test_topk_records_parses_structured_payloads_and_query_plan.
    top = client.topk_records(
        models.ChonkyDBTopKRecordsRequest(
            query_text="medication",
            result_limit=1,
            namespace=NAMESPACE,
            scope_ref="longterm:objects:current",
        )
    )
    assert top.success and top.mode == "advanced"
    assert top.results[0].document_id == meds_id == top.results[0].payload_id
    assert top.results[0].payload == {"memory_id": "fact:meds", "note": "Bring medication"}
    assert top.results[0].payload_source == "payload"
    assert set(top.results[0].score_breakdown or {}) >= {"lexical", "vector"}
    assert top.scope_ref == "longterm:objects:current"
    assert top.query_plan is not None
    latency = top.query_plan["latency_ms"]
    assert isinstance(latency, dict) and all(isinstance(v, float) for v in latency.values())

    # test_retrieve_parses_hits_and_query, sent as Twinr's fallback sends it: no
    # namespace, no scope_ref; the scope is the one the allowed ids belong to.
    hits = client.retrieve(
        models.ChonkyDBRetrieveRequest(
            query_text="medication reminder",
            result_limit=2,
            allowed_indexes=("ccodex_memory_fulltext",),
            allowed_doc_ids=(walk_id, meds_id),
        )
    )
    assert hits.success and hits.mode == "advanced"
    assert hits.results[0].payload_id == meds_id
    assert {h.payload_id for h in hits.results} <= {walk_id, meds_id}
    assert hits.results[0].metadata is not None
    assert hits.results[0].metadata["twinr_snapshot_kind"] == "objects"
    # allowed_indexes named only the full-text index: the vector index is not searched.
    assert "bm25" in hits.indexes_used and "vector" not in hits.indexes_used
    assert hits.raw["scope_ref"] == "longterm:objects:current"

    # Twinr's filtered catalog search: topk_records with a real query and allowed ids
    # ranks within them (not the by-id call), the best match first whatever the order.
    within = client.topk_records(
        models.ChonkyDBTopKRecordsRequest(
            query_text="peppermint tea",
            result_limit=1,
            include_content=False,
            include_metadata=True,
            allowed_doc_ids=(walk_id, meds_id, tea_id),
        )
    )
    assert [h.document_id for h in within.results] == [tea_id]
    assert within.results[0].payload == {
        "memory_id": "fact:tea",
        "note": "Peppermint tea in the evening",
    }
    assert within.query_plan is not None
    assert within.query_plan["candidate_scope_mode"] == "allowed_doc_ids"
    assert within.scope_ref == "longterm:objects:current"
    # Ids of no current record: nothing to rank, an empty answer (as ChonkyDB's).
    nothing = client.topk_records(
        models.ChonkyDBTopKRecordsRequest(query_text="tea", allowed_doc_ids=("unknown-id",))
    )
    assert nothing.success and nothing.results == ()
    # Ids of two scopes and no scope_ref: which to rank in is ambiguous, a 422.
    conflict_id = derive_document_id(NAMESPACE, "conflicts", "conflict:keys")
    with pytest.raises(client_mod.ChonkyDBError) as ambiguous:
        client.retrieve(
            models.ChonkyDBRetrieveRequest(
                query_text="keys", allowed_doc_ids=(meds_id, conflict_id)
            )
        )
    assert ambiguous.value.status_code == 422
    assert ambiguous.value.response_json["error"]["details"]["snapshot_kinds"] == [
        "conflicts",
        "objects",
    ]

    # test_list_records_and_full_document_build_query_strings.
    records = client.list_records(limit=2, include_metadata=False)
    assert records.returned_count == 2 and records.total_count >= 2
    assert all(isinstance(p.payload_id, str) and p.metadata is None for p in records.payloads)
    document = client.fetch_full_document(document_id=meds_id, include_content=False)
    assert document["document_id"] == meds_id and document["content"] is None
    # ChonkyDB's route test: `include_document=true` adds the document.
    with_document = client.get_record(meds_id, include_document=True)
    assert with_document["document"]["document_id"] == meds_id

    # Refusals with a code: a mode Orrery lacks, a `by` ChonkyDB lacks too, a by-id call
    # over its bound, allowed ids of a snapshot kind no scope ref reads.
    refusals = [
        (
            lambda: client.topk_records(
                models.ChonkyDBTopKRecordsRequest(
                    query_text="tea", mode="basic", namespace=NAMESPACE
                )
            ),
            422,
        ),
        (lambda: client.get_record(meds_id, by="uri"), 422),
        (
            lambda: client.topk_records(
                models.ChonkyDBTopKRecordsRequest(
                    query_text="__allowed_doc_ids__",
                    allowed_doc_ids=tuple(f"id-{i}" for i in range(501)),
                )
            ),
            422,
        ),
    ]
    notes = client.store_records_bulk(
        models.ChonkyDBBulkRecordRequest(
            items=(
                models.ChonkyDBRecordItem(
                    payload={"memory_id": "note:1", "text": "a loose note about tea"},
                    metadata={"twinr_namespace": NAMESPACE, "twinr_snapshot_kind": "notes"},
                ),
            )
        )
    )
    notes_id = notes["items"][0]["document_id"]
    refusals.append(
        (
            lambda: client.retrieve(
                models.ChonkyDBRetrieveRequest(query_text="tea", allowed_doc_ids=(notes_id,))
            ),
            404,
        )
    )
    for call, status in refusals:
        with pytest.raises(client_mod.ChonkyDBError) as refusal:
            call()
        assert refusal.value.status_code == status
        assert isinstance(refusal.value.response_json["error"]["code"], str)

    # test_job_status_builds_status_endpoint_url: a job this process does not know.
    with pytest.raises(client_mod.ChonkyDBError) as unknown_job:
        client.job_status("job-bulk-1")
    assert unknown_job.value.status_code == 404
    assert unknown_job.value.response_json["error"]["code"] == "unknown_job"

    # test_http_errors_raise_chonkydb_error_with_json_body: {"query_text": "hello"} is
    # no ChonkyDB body (no dialect field), so Orrery's shape answers: 422, JSON error.
    with pytest.raises(client_mod.ChonkyDBError) as invalid:
        client.retrieve({"query_text": "hello"})
    assert invalid.value.status_code == 422
    assert invalid.value.response_json["error"]["code"] == "invalid_request"

    # test_http_errors_preserve_retry_after_header: an empty bulk write. Orrery refuses
    # it as invalid (422, no Retry-After: retrying cannot help), where the recorded
    # ChonkyDB answer was 429 with Retry-After.
    with pytest.raises(client_mod.ChonkyDBError) as empty:
        client.store_records_bulk({"items": []})
    assert empty.value.status_code == 422
    assert empty.value.response_headers is not None
    assert empty.value.retry_after_seconds() is None

    # test_fetch_full_document_accepts_large_snapshot_payload_within_configured_response_limit
    big = "x" * 150_000
    written = client.store_records_bulk(
        models.ChonkyDBBulkRecordRequest(
            items=(
                models.ChonkyDBRecordItem(
                    payload={"memory_id": "snapshot:big"},
                    metadata={"twinr_namespace": NAMESPACE, "twinr_snapshot_kind": "archive"},
                    content=big,
                ),
            )
        )
    )
    big_id = written["items"][0]["document_id"]
    payload = client.fetch_full_document(document_id=big_id, max_content_chars=2_000_000)
    assert payload["success"] and payload["content"] == big
