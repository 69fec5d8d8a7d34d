from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from contracts.records import Record
from ingest.sample import SAMPLE_NAMESPACE, sample_queries, sample_records
from query.model import BUILTIN_SCOPES

KINDS = {"objects", "conflicts", "archive", "midterm", "graph"}
UMLAUTS = set("äöüÄÖÜß")


def test_deterministic() -> None:
    first, second = sample_records(), sample_records()
    assert [r.model_dump() for r in first] == [r.model_dump() for r in second]
    assert sample_queries() == sample_queries()


def test_size_and_identity() -> None:
    records = sample_records()
    assert 250 <= len(records) <= 400
    assert all(isinstance(r, Record) for r in records)
    assert len({r.doc_id for r in records}) == len(records)
    assert len({r.item_id for r in records}) == len(records)
    assert all(r.namespace == SAMPLE_NAMESPACE for r in records)
    assert all(r.vector is None and not r.deleted for r in records)
    assert {r.revision for r in records} == {1, 2}


def test_namespace_parameter() -> None:
    records = sample_records("other-ns")
    assert {r.namespace for r in records} == {"other-ns"}
    assert [r.item_id for r in records] == [r.item_id for r in sample_records()]


def test_round_trip_validates() -> None:
    for record in sample_records():
        assert Record.model_validate(record.model_dump()) == record


def test_kinds_and_prefixes() -> None:
    records = sample_records()
    counts = Counter(r.snapshot_kind for r in records)
    assert set(counts) == KINDS
    assert counts["objects"] >= 150
    assert counts["conflicts"] >= 40
    prefixes = {
        "objects": "fact:",
        "conflicts": "conflict:",
        "archive": "archive:",
        "midterm": "episode:",
        "graph": "rel:",
    }
    for record in records:
        assert record.item_id.startswith(prefixes[record.snapshot_kind])
        assert record.payload["memory_id"] == record.item_id
        assert record.payload["status"] == record.metadata.status
        assert record.payload["summary"] == record.text.body
        assert record.text.title and record.text.tags


def test_languages() -> None:
    records = sample_records()
    langs = Counter(r.metadata.facets()["lang"][0] for r in records)
    assert set(langs) == {"de", "en"}
    assert min(langs.values()) >= len(records) // 3
    german = [r for r in records if r.metadata.facets()["lang"] == ["de"]]
    with_umlauts = [r for r in german if UMLAUTS & set(r.text.title + r.text.body)]
    assert len(with_umlauts) >= 50


def test_variety_of_metadata() -> None:
    records = sample_records()
    assert {r.metadata.status for r in records} >= {
        "active",
        "candidate",
        "uncertain",
        "superseded",
        "archived",
    }
    assert {r.galaxy for r in records} == {"default", "anna"}
    assert {v for r in records for v in r.metadata.visibility} == {"family", "private", "guests"}
    assert {"home/kitchen", "home/hall", "health/medication", "people/family"} <= {
        r.ring for r in records
    }
    stamps = [r.metadata.updated_at for r in records]
    assert min(stamps) >= datetime(2025, 1, 1, tzinfo=UTC)
    assert max(stamps) <= datetime(2026, 11, 1, tzinfo=UTC)
    assert len({s.date() for s in stamps}) > 200


def test_thermos_facts() -> None:
    by_id = {r.item_id: r for r in sample_records()}
    old = by_id["fact:thermos_location_old"]
    assert old.snapshot_kind == "objects"
    assert old.payload_schema == "twinr_memory_object_record_v2"
    assert old.payload == {
        "memory_id": "fact:thermos_location_old",
        "kind": "fact",
        "summary": "Früher stand deine rote Thermoskanne im Flurschrank.",
        "status": "active",
        "slot_key": "location:thermos",
        "value_key": "flurschrank",
    }
    current = by_id["fact:thermos_location_current"]
    assert current.payload["value_key"] == "kuechenregal"
    assert current.metadata.updated_at > old.metadata.updated_at
    conflict = by_id["conflict:thermos_location"]
    assert conflict.snapshot_kind == "conflicts"
    assert {c["memory_id"] for c in conflict.payload["candidates"]} == {
        old.item_id,
        current.item_id,
    }
    assert conflict.payload["resolution_status"] == "open"


def test_archive_is_older_than_successors() -> None:
    by_id = {r.item_id: r for r in sample_records()}
    for record in by_id.values():
        if record.snapshot_kind != "archive":
            continue
        assert record.metadata.status in {"superseded", "archived"}
        successor = record.payload.get("superseded_by")
        if successor is not None:
            assert record.metadata.status == "superseded"
            assert by_id[successor].metadata.updated_at > record.metadata.updated_at


def test_conflicts_list_two_candidates() -> None:
    for record in sample_records():
        if record.snapshot_kind == "conflicts":
            assert len(record.payload["candidates"]) == 2
            assert record.payload["resolution_status"]


def test_queries_point_at_existing_items() -> None:
    by_id = {r.item_id: r for r in sample_records()}
    queries = sample_queries()
    assert 8 <= len(queries) <= 15
    langs = set()
    for query in queries:
        assert set(query) == {"scope_ref", "query_text", "expect_item_id"}
        record = by_id[query["expect_item_id"]]
        assert record.snapshot_kind == BUILTIN_SCOPES[query["scope_ref"]]
        langs.add(record.metadata.facets()["lang"][0])
    assert langs == {"de", "en"}
    assert {
        "scope_ref": "longterm:objects:current",
        "query_text": "Wo stand früher meine rote Thermoskanne?",
        "expect_item_id": "fact:thermos_location_old",
    } in queries
