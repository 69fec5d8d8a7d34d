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
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.records import derive_document_id
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
        env.update(server_env(uuid.uuid4().hex[:8]))
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
            ),
            client_request_id="bulk-1",
        )
    )
    assert written["success"] and written["succeeded"] == 4
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
    assert listed.total_count == 5 and listed.returned_count == 2
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
    assert client.list_records().total_count == 4


def test_unknown_fields_fail_loudly_in_orrerys_shape(twinr: tuple[Any, Any, Server]) -> None:
    client, _models, _srv = twinr
    with pytest.raises(Exception) as failed:
        client.topk_records(
            {"mode": "advanced", "query_text": "x", "namespace": NAMESPACE, "bogus": 1}
        )
    assert getattr(failed.value, "status_code", None) == 422
    assert failed.value.response_json["error"]["code"] == "unknown_field"  # type: ignore[attr-defined]
