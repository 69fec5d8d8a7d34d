"""Twinr's own long-term memory store, unchanged, against a running `orrery serve`.

Not the client alone (`test_twinr_client.py`) but the code that uses it on the device:
`LongTermRemoteCatalogStore` over `LongTermRemoteStateStore`, imported from
`../shared/clients/twinr-src/` (reference material, not project code; without it the
suite skips locally and fails when `ORRERY_REQUIRE_SERVERS=1`). It writes through its
own path (`build_catalog_payload` / `persist_catalog_payload`: bulk writes, catalog head
and segments with `target_indexes: []`, items with `["fulltext", "temporal", "tags"]`)
and reads everything back the way the device does; the assertions are on what Twinr's
store returns. Every request body Twinr sent is logged (urllib3-level hook, Twinr's code
untouched), so a change of its shapes shows in the test log.

Both deployments: embedded, and server mode (PostgreSQL, Kafka, OpenSearch, Qdrant,
Redis).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import DEPLOYMENTS
from tests.e2e.test_servers_http import server_env

# Twinr's tree imports modules Python 3.11 deprecates (`audioop`): its warnings, not ours.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

log = logging.getLogger("twinr.requests")

TWINR_SRC = Path(__file__).resolve().parents[3] / "shared" / "clients" / "twinr-src"
if not TWINR_SRC.is_dir():
    TWINR_SRC = Path("/work/shared/clients/twinr-src")
API_KEY = "twinr-runtime-key"
NAMESPACE = "twinr_longterm_v1:Zuhause:a7f1ed265838"


def _import_twinr() -> tuple[Any, Any, Any]:
    """Twinr's storage layer without the rest of its runtime (its README: the two
    packages whose `__init__` pulls the whole runtime are registered bare)."""
    if not (TWINR_SRC / "twinr").is_dir():
        if os.environ.get("ORRERY_REQUIRE_SERVERS", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"Twinr's runtime source is missing at {TWINR_SRC}")
        pytest.skip(f"Twinr's runtime source is missing at {TWINR_SRC}")
    loaded = sys.modules.get("twinr")
    if loaded is not None and not any(
        str(path).startswith(str(TWINR_SRC)) for path in getattr(loaded, "__path__", [])
    ):
        # Another `twinr` tree was imported first (test_twinr_client: the client alone,
        # with a stub config module): this suite needs the whole runtime's.
        for name in [n for n in sys.modules if n == "twinr" or n.startswith("twinr.")]:
            del sys.modules[name]
    if str(TWINR_SRC) in sys.path:
        sys.path.remove(str(TWINR_SRC))
    sys.path.insert(0, str(TWINR_SRC))
    for name in ("twinr.memory.longterm", "twinr.memory.longterm.storage"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(TWINR_SRC / name.replace(".", "/"))]
            sys.modules[name] = package
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from twinr.memory.longterm.storage import remote_catalog, remote_state

    return remote_catalog, remote_state, sys.modules["twinr.memory.chonkydb.client"]


def _config(base_url: str) -> types.SimpleNamespace:
    """The `long_term_memory_*` settings `remote_state.py` reads: remote-primary,
    required, no read cache, no diagnostics files (`project_root=None`)."""
    return types.SimpleNamespace(
        long_term_memory_enabled=True,
        long_term_memory_mode="remote_primary",
        long_term_memory_remote_required=True,
        long_term_memory_remote_namespace=NAMESPACE,
        long_term_memory_migration_enabled=False,
        long_term_memory_path="state/memory",
        long_term_memory_remote_read_timeout_s=30.0,
        long_term_memory_remote_write_timeout_s=60.0,
        long_term_memory_remote_flush_timeout_s=60.0,
        long_term_memory_remote_retry_attempts=2,
        long_term_memory_remote_retry_backoff_s=0.2,
        long_term_memory_remote_read_cache_ttl_s=0.0,
        long_term_memory_remote_max_content_chars=4_000,
        chonkydb_base_url=base_url,
        chonkydb_api_key=API_KEY,
        chonkydb_api_key_header="x-api-key",
        chonkydb_allow_bearer_auth=False,
        chonkydb_max_response_bytes=64 * 1024 * 1024,
        chonkydb_timeout_s=30.0,
        project_root=None,
    )


class _Recorder:
    """Every request Twinr's client sends through urllib3: method, path, JSON body,
    answer status. Logged as it goes."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import urllib3

        original = urllib3.PoolManager.request
        recorder = self

        def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            body = kwargs.get("body")
            parsed: Any = None
            if body:
                try:
                    parsed = json.loads(body)
                except ValueError:
                    parsed = f"<{len(body)} bytes>"
            response = original(self, method, url, *args, **kwargs)
            path = url.split("://", 1)[-1].split("/", 1)[-1]
            entry = {
                "method": method,
                "path": "/" + path,
                "body": parsed,
                "status": response.status,
            }
            recorder.requests.append(entry)
            log.info("twinr → %s", json.dumps(entry, ensure_ascii=False, sort_keys=True))
            return response

        monkeypatch.setattr(urllib3.PoolManager, "request", request)

    def bodies(self, path: str) -> list[Any]:
        return [r["body"] for r in self.requests if r["path"].split("?")[0] == path]

    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["status"] >= 400]


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    _import_twinr()
    env = {"ORRERY_API_KEYS": f"{API_KEY}={NAMESPACE}"}
    if request.param == "servers":
        env.update(server_env(run_tag()))
    srv = start_server(tmp_path_factory.mktemp("twinr-runtime") / "data", env=env)
    yield srv
    srv.stop()


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    out = _Recorder()
    out.install(monkeypatch)
    return out


def _stores(srv: Server) -> tuple[Any, Any, Any]:
    remote_catalog, remote_state, client = _import_twinr()
    state = remote_state.LongTermRemoteStateStore.from_config(
        _config(f"http://127.0.0.1:{srv.port}")
    )
    assert state.enabled and state.read_client is not None
    return remote_catalog.LongTermRemoteCatalogStore(state), remote_state, client


# -- what Twinr stores (shapes as its structured store builds them) --------------------

OBJECTS = [
    {
        "memory_id": "fact:lukas_birthday",
        "kind": "fact",
        "summary": "Lukas's birthday is on the 14th of May",
        "details": "Lukas, the grandson, was born on 14 May 2015.",
        "status": "active",
        "slot_key": "person:lukas:birthday",
        "value_key": "2015-05-14",
        "created_at": "2026-03-01T09:00:00+00:00",
        "updated_at": "2026-03-01T09:00:00+00:00",
    },
    {
        "memory_id": "fact:thermos",
        "kind": "fact",
        "summary": "Die rote Thermoskanne steht im Flurschrank",
        "details": "Oberstes Fach, links.",
        "status": "active",
        "slot_key": "object:thermos:location",
        "value_key": "flurschrank",
        "created_at": "2026-03-02T10:00:00+00:00",
        "updated_at": "2026-03-02T10:00:00+00:00",
    },
    {
        "memory_id": "fact:keys",
        "kind": "fact",
        "summary": "The spare keys hang on the hook by the front door",
        "details": "",
        "status": "active",
        "slot_key": "object:keys:location",
        "value_key": "hook",
        "created_at": "2026-03-03T11:00:00+00:00",
        "updated_at": "2026-03-03T11:00:00+00:00",
    },
    {
        "memory_id": "fact:lukas_school",
        "kind": "fact",
        "summary": "Lukas goes to the primary school in the village",
        "details": "Third grade.",
        "status": "active",
        "slot_key": "person:lukas:school",
        "value_key": "village_school",
        "created_at": "2026-03-04T08:00:00+00:00",
        "updated_at": "2026-03-04T08:00:00+00:00",
    },
    {
        "memory_id": "fact:anna_birthday",
        "kind": "fact",
        "summary": "Anna's birthday is in October",
        "details": "",
        "status": "active",
        "slot_key": "person:anna:birthday",
        "value_key": "october",
        "created_at": "2026-03-05T08:00:00+00:00",
        "updated_at": "2026-03-05T08:00:00+00:00",
    },
]
CONFLICTS = [
    {
        "slot_key": "object:keys:location",
        "candidate_memory_id": "fact:keys_drawer",
        "existing_memory_ids": ["fact:keys"],
        "question": "Are the spare keys on the hook or in the kitchen drawer?",
        "reason": "Two answers for where the keys are",
    }
]
MIDTERM = [
    {
        "packet_id": "packet:keys_today",
        "kind": "recent_focus",
        "summary": "Asked twice today where the spare keys are",
        "details": "Morning and after lunch.",
        "query_hints": ["keys", "Schlüssel"],
        "updated_at": "2026-03-19T12:00:00+00:00",
    },
    {
        "packet_id": "packet:lukas_visit",
        "kind": "recent_focus",
        "summary": "Lukas visits on Saturday for his birthday cake",
        "details": "",
        "query_hints": ["Lukas", "birthday"],
        "updated_at": "2026-03-19T13:00:00+00:00",
    },
]
GRAPH_NODES = [
    {"id": "user:main", "type": "user", "label": "Main user", "attributes": {}},
    {"id": "person:lukas", "type": "person", "label": "Lukas, grandson", "attributes": {}},
    {"id": "object:thermos", "type": "object", "label": "Red thermos", "attributes": {}},
]


def _object_metadata(item: Mapping[str, Any]) -> dict[str, Any]:
    # As `_structured_store/snapshots.py` `_remote_item_metadata` builds it for objects.
    return {
        "kind": item["kind"],
        "status": item["status"],
        "summary": item["summary"],
        "search_text": _object_text(item),
        "slot_key": item["slot_key"],
        "value_key": item["value_key"],
        "created_at": item["created_at"],
        "updated_at": item["updated_at"],
        "selection_projection": {
            "memory_id": item["memory_id"],
            "summary": item["summary"],
            "status": item["status"],
        },
    }


def _object_text(item: Mapping[str, Any]) -> str:
    return " ".join(str(item[k]) for k in ("summary", "details", "slot_key") if item.get(k))


def _conflict_id(item: Mapping[str, Any]) -> str:
    return f"conflict:{item['slot_key']}"


def _conflict_metadata(item: Mapping[str, Any]) -> dict[str, Any]:
    # The same builder for conflicts: `updated_at` holds the question text.
    return {
        "slot_key": item["slot_key"],
        "candidate_memory_id": item["candidate_memory_id"],
        "existing_memory_ids": item["existing_memory_ids"],
        "question": item["question"],
        "reason": item["reason"],
        "updated_at": item.get("question") or item.get("reason") or item["slot_key"],
        "selection_projection": {"slot_key": item["slot_key"], "question": item["question"]},
    }


def _persist(
    catalog: Any,
    kind: str,
    items: list[dict[str, Any]],
    item_id: Callable[[Mapping[str, Any]], str],
    metadata: Callable[[Mapping[str, Any]], dict[str, Any]],
    content: Callable[[Mapping[str, Any]], str],
) -> dict[str, Any]:
    """Twinr's write path: items and catalog segments through `build_catalog_payload`,
    then the current head through `persist_catalog_payload`."""
    head: dict[str, Any] = catalog.build_catalog_payload(
        snapshot_kind=kind,
        item_payloads=items,
        item_id_getter=item_id,
        metadata_builder=metadata,
        content_builder=content,
        replace_invalid_current_head=True,
    )
    catalog.persist_catalog_payload(snapshot_kind=kind, payload=head)
    return head


def _persist_all(catalog: Any) -> None:
    _persist(catalog, "objects", OBJECTS, lambda i: i["memory_id"], _object_metadata, _object_text)
    _persist(
        catalog,
        "conflicts",
        CONFLICTS,
        _conflict_id,
        _conflict_metadata,
        lambda i: f"{i['question']} {i['reason']}",
    )
    _persist(
        catalog,
        "midterm",
        MIDTERM,
        lambda i: i["packet_id"],
        lambda i: {"kind": i["kind"], "updated_at": i["updated_at"]},
        lambda i: " ".join([i["summary"], i["details"], *i["query_hints"]]),
    )
    _persist(
        catalog,
        "graph_nodes",
        GRAPH_NODES,
        lambda i: i["id"],
        lambda i: {
            "node_type": i["type"],
            "label": i["label"],
            "summary": i["label"],
            "search_text": f"{i['label']} {i['type']}",
        },
        lambda i: f"{i['label']} {i['type']}",
    )


def _ids(items: tuple[dict[str, Any], ...] | None, key: str) -> list[str]:
    assert items is not None
    return [str(i.get(key)) for i in items]


def test_twinr_long_term_store_writes_and_reads_through_orrery(
    server: Server, recorder: _Recorder
) -> None:
    catalog, remote_state, client_mod = _stores(server)
    read_failed = remote_state.LongTermRemoteReadFailedError

    _persist_all(catalog)
    server.wait_projected(headers={"x-api-key": API_KEY})

    # Every write Twinr made was accepted. The only refusals: its look for a current
    # head before the first one was written (404, as ChonkyDB answers it).
    writes = recorder.bodies("/v1/external/records/bulk")
    assert writes, "Twinr wrote nothing through records/bulk"
    refused = recorder.failures()
    assert all(
        r["status"] == 404
        and r["method"] == "GET"
        and r["path"].startswith("/v1/external/documents/full?origin_uri=")
        and "catalog%2Fcurrent" in r["path"]
        for r in refused
    ), refused
    recorder.requests.clear()
    target_sets = {
        tuple(item.get("target_indexes") or ()) for body in writes for item in body["items"]
    }
    assert ("fulltext", "temporal", "tags") in target_sets and () in target_sets

    # Catalog heads and entries, as Twinr loads them.
    for kind, items, key in (
        ("objects", OBJECTS, "memory_id"),
        ("conflicts", CONFLICTS, None),
        ("midterm", MIDTERM, "packet_id"),
        ("graph_nodes", GRAPH_NODES, "id"),
    ):
        head = catalog.load_catalog_payload(snapshot_kind=kind)
        assert head is not None and catalog.is_catalog_payload(snapshot_kind=kind, payload=head)
        entries = catalog.load_catalog_entries(snapshot_kind=kind, bypass_cache=True)
        expected = [_conflict_id(i) if key is None else i[key] for i in items]
        assert sorted(e.item_id for e in entries) == sorted(expected), kind
        if kind == "objects":  # written sync; async kinds' entries resolve ids by uri
            assert all(e.document_id for e in entries), kind

    # The device's hot path: the fast current-scope search (Twinr's allowed_indexes
    # `fulltext`, `temporal`, `tags`); catalog heads and segments are never hits.
    try:
        fast = catalog.search_current_item_payloads_fast(
            snapshot_kind="objects", query_text="When is Lukas's birthday?", limit=3
        )
    except read_failed as exc:  # pragma: no cover - the failure this suite exists for
        pytest.fail(f"search_current_item_payloads_fast failed: {exc!r}")
    fast_ids = _ids(fast, "memory_id")
    assert len(fast_ids) == 3, fast_ids
    assert fast_ids[0] == "fact:lukas_birthday"
    assert set(fast_ids) <= {o["memory_id"] for o in OBJECTS}
    assert set(fast_ids) >= {"fact:lukas_birthday", "fact:anna_birthday", "fact:lukas_school"}
    topk = recorder.bodies("/v1/external/retrieve/topk_records")
    assert any(b.get("allowed_indexes") == ["fulltext", "temporal", "tags"] for b in topk)

    # Ranked search of every other collection.
    conflicts = catalog.search_current_item_payloads(
        snapshot_kind="conflicts", query_text="where are the spare keys", limit=3
    )
    assert _ids(conflicts, "slot_key") == ["object:keys:location"]
    assert conflicts is not None and conflicts[0]["question"] == CONFLICTS[0]["question"]
    midterm = catalog.search_current_item_payloads(
        snapshot_kind="midterm", query_text="spare keys", limit=2
    )
    assert _ids(midterm, "packet_id")[0] == "packet:keys_today"
    # Graph nodes are projection-only in Twinr (no item documents: the nodes live in
    # the catalog's entries), so a scope search finds nothing — in particular not the
    # catalog head or segment Twinr wrote with `target_indexes: []` (their text names
    # every node) — and Twinr reads the nodes from the catalog (entries, above).
    nodes = catalog.search_current_item_payloads(
        snapshot_kind="graph_nodes", query_text="Lukas grandson person", limit=2
    )
    assert not nodes
    objects = catalog.search_current_item_payloads(
        snapshot_kind="objects", query_text="red thermos Thermoskanne", limit=2
    )
    assert _ids(objects, "memory_id")[0] == "fact:thermos"

    # The local catalog search over the entries Twinr loaded.
    found = catalog.search_catalog_entries(
        snapshot_kind="objects", query_text="Lukas birthday", limit=2
    )
    assert found and found[0].item_id == "fact:lukas_birthday"

    # Hydration by item id (topk_records with allowed_doc_ids, the by-id call), in the
    # order asked.
    asked = ["fact:keys", "fact:lukas_birthday", "fact:thermos"]
    hydrated = catalog.load_item_payloads(snapshot_kind="objects", item_ids=asked)
    assert _ids(hydrated, "memory_id") == asked
    assert hydrated[1]["summary"] == OBJECTS[0]["summary"]
    by_id = [
        b for b in recorder.bodies("/v1/external/retrieve/topk_records") if b.get("allowed_doc_ids")
    ]
    assert by_id and by_id[-1]["query_text"] == "__allowed_doc_ids__"

    # The retrieve fallback Twinr takes when topk_records is unavailable: the same
    # by-id body on `retrieve` answers the same records.
    client = catalog.remote_state.read_client
    entries = {e.item_id: e for e in catalog.load_catalog_entries(snapshot_kind="objects")}
    doc_ids = [entries[i].document_id for i in asked]
    fallback = client.retrieve(
        sys.modules["twinr.memory.chonkydb.models"].ChonkyDBRetrieveRequest(
            query_text="__allowed_doc_ids__",
            result_limit=len(doc_ids),
            include_content=False,
            include_metadata=True,
            allowed_indexes=("fulltext",),
            allowed_doc_ids=tuple(doc_ids),
        )
    )
    candidates = list(catalog._iter_retrieve_result_candidates(fallback))
    assert [c["payload_id"] for c in candidates] == doc_ids
    assert [c["metadata"]["twinr_memory_item_id"] for c in candidates] == asked
    # Chunks, when asked for (Twinr reads payloads out of them): one per record.
    record = client.get_record(doc_ids[0], include_chunks=True)
    assert len(record["chunks"]) == 1
    assert record["chunks"][0]["metadata"]["twinr_memory_item_id"] == "fact:keys"
    full = server.client.get(
        "/v1/external/documents/full",
        params={"document_id": doc_ids[0], "include_chunks": "true"},
        headers={"x-api-key": API_KEY},
    )
    assert full.status_code == 200 and full.json()["chunks"][0]["document_id"] == doc_ids[0]
    del client_mod

    # Delete, Twinr's way: the collection written again without the item. The catalog,
    # hydration and every search then leave it out.
    remaining = [o for o in OBJECTS if o["memory_id"] != "fact:anna_birthday"]
    _persist(
        catalog, "objects", remaining, lambda i: i["memory_id"], _object_metadata, _object_text
    )
    server.wait_projected(headers={"x-api-key": API_KEY})
    entries_after = catalog.load_catalog_entries(snapshot_kind="objects", bypass_cache=True)
    assert sorted(e.item_id for e in entries_after) == sorted(o["memory_id"] for o in remaining)
    assert (
        catalog.load_item_payloads(snapshot_kind="objects", item_ids=["fact:anna_birthday"]) == ()
    )
    after = catalog.search_current_item_payloads_fast(
        snapshot_kind="objects", query_text="When is Anna's birthday?", limit=3
    )
    assert "fact:anna_birthday" not in _ids(after, "memory_id")

    assert recorder.failures() == [], recorder.failures()
