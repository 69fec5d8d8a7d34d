"""One record-size bound on every write route (issue 22): `ORRERY_MAX_RECORD_BYTES`, read
once at startup, checked at the door (`contracts.admission.check_record_size`).

A record whose stored JSON is one byte over the bound is `413 record_too_large` with
`details.max_record_bytes` (a line of an import: an `errorLines` entry with the same code
and details), nothing of it written; a record of exactly the bound is written. Routes:
`POST /v1/records`, ChonkyDB's `records/bulk`, the KoutenDB import (a real `orrery
serve`, embedded), `orrery ingest` and `orrery import-jsonl`; server mode's default (one
Kafka message, 960 KiB) on `POST /v1/records`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from contracts.admission import record_bytes
from contracts.chonkydb import BulkRecordItem
from contracts.events import KAFKA_MAX_RECORD_BYTES
from contracts.records import Record, derive_document_id
from ingest.entrypoints.chonkydb_http import to_record
from ingest.koutendb_io import ImportOptions, map_line
from orrery.cli import app
from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_servers_http import server_env

NS = "sized"
KIND = "objects"
BOUND = 20_000
NDJSON = {"content-type": "application/x-ndjson"}
# Any text, as long as JSON can carry it (no lone surrogates): multi-byte and escaped
# characters make the stored size differ from the character count.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)

# A record's stored size as a function of its filler's length `n` and a number `k` the
# lexical body does not repeat (it moves the size by single bytes).
Sizer = Callable[[int, int], int]


def fit(size_of: Sizer, target: int) -> tuple[int, int]:
    """(n, k) whose record is exactly `target` bytes as stored."""
    base = size_of(0, 1)
    slope = size_of(1, 1) - base
    n = (target - base) // slope
    for k in (1, 10, 100, 1_000, 10_000):
        if size_of(n, k) == target:
            return n, k
    raise AssertionError(f"no record of exactly {target} bytes (slope {slope})")


def record_json(item: str, prefix: str, n: int, k: int) -> dict[str, Any]:
    return {
        "namespace": NS,
        "snapshot_kind": KIND,
        "item_id": item,
        "revision": 1,
        "text": {"title": "sized", "body": "a record at its bound"},
        "metadata": {"status": "active", "updated_at": "2026-03-19T12:00:00Z"},
        "payload": {"blob": prefix + "x" * n, "k": k},
    }


def record_size(raw: dict[str, Any]) -> int:
    return record_bytes(Record.model_validate(raw))


def bulk_item(item: str, prefix: str, n: int, k: int) -> dict[str, Any]:
    return {
        "item_id": item,
        "content": "a chonky record at its bound",
        "payload": {"blob": prefix + "x" * n, "k": k},
        "metadata": {"twinr_namespace": NS, "twinr_snapshot_kind": KIND},
    }


def bulk_size(item: dict[str, Any]) -> int:
    raw = to_record(BulkRecordItem.model_validate(item), None)
    return record_size({**raw, "revision": 1})


def import_row(item: str, prefix: str, n: int, k: int) -> dict[str, Any]:
    return {"id": item, "blob": prefix + "x" * n, "k": k}


def import_size(row: dict[str, Any]) -> int:
    """What `JsonlImporter` stores for `row` (a new document: revision 1)."""
    options = ImportOptions(
        namespace=NS, snapshot_kind=KIND, galaxy="default", id_field="id", max_record_bytes=BOUND
    )
    raw = map_line(json.dumps(row).encode(), options)
    assert raw is not None
    doc_id = derive_document_id(NS, KIND, raw["item_id"], "default")
    return record_size({**raw, "revision": 1, "document_id": doc_id})


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(
        tmp_path_factory.mktemp("sized") / "data", env={"ORRERY_MAX_RECORD_BYTES": str(BOUND)}
    )
    try:
        yield server
    finally:
        server.stop()


def high_water(srv: Server) -> int:
    return int(srv.client.get("/v1/readiness").json()["log_high_water"])


def assert_too_large(error: dict[str, Any], record_bytes: int) -> None:
    assert error["code"] == "record_too_large", error
    assert error["details"]["max_record_bytes"] == BOUND
    assert error["details"]["record_bytes"] == record_bytes


def post_records(srv: Server, item: str, prefix: str, over: int) -> None:
    def size(n: int, k: int) -> int:
        return record_size(record_json(item, prefix, n, k))

    n, k = fit(size, BOUND + over)
    before = high_water(srv)
    answer = srv.post_records([record_json(item, prefix, n, k)])
    if over > 0:
        assert answer.status_code == 413, answer.text[:300]
        assert_too_large(answer.json()["error"], BOUND + over)
        assert high_water(srv) == before
    else:
        assert answer.status_code == 200, answer.text[:300]
        assert [i["status"] for i in answer.json()["items"]] == [201]


def chonkydb_bulk(srv: Server, item: str, prefix: str, over: int) -> None:
    def size(n: int, k: int) -> int:
        return bulk_size(bulk_item(item, prefix, n, k))

    n, k = fit(size, BOUND + over)
    before = high_water(srv)
    answer = srv.client.post(
        "/v1/external/records/bulk", json={"items": [bulk_item(item, prefix, n, k)]}
    )
    if over > 0:
        assert answer.status_code == 413, answer.text[:300]
        assert_too_large(answer.json()["error"], BOUND + over)
        assert high_water(srv) == before
    else:
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["succeeded"] == 1


def koutendb_import(srv: Server, item: str, prefix: str, over: int) -> None:
    def size(n: int, k: int) -> int:
        return import_size(import_row(item, prefix, n, k))

    n, k = fit(size, BOUND + over)
    before = high_water(srv)
    answer = srv.client.post(
        "/v1/koutendb/import",
        params={"namespace": NS, "idField": "id"},
        content=json.dumps(import_row(item, prefix, n, k)).encode() + b"\n",
        headers=NDJSON,
    )
    assert answer.status_code == 200, answer.text[:300]
    out = answer.json()
    if over > 0:
        assert (out["imported"], out["errors"]) == (0, 1)
        (line,) = out["errorLines"]
        assert line["line"] == 1
        assert_too_large(line, BOUND + over)
        assert high_water(srv) == before
    else:
        assert (out["imported"], out["errors"]) == (1, 0), out


SERIAL = itertools.count()
ROUTES = {
    "records": post_records,
    "chonkydb-bulk": chonkydb_bulk,
    "koutendb-import": koutendb_import,
}


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=st.sampled_from(sorted(ROUTES)), prefix=TEXT, over=st.sampled_from([0, 1, 2, 700]))
def test_every_http_write_route_takes_exactly_the_bound_and_refuses_one_byte_more(
    srv: Server, route: str, prefix: str, over: int
) -> None:
    item = f"{route}-{over}-{next(SERIAL)}"  # a new document each time (revision 1)
    ROUTES[route](srv, item, prefix, over)


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("over", [0, 1], ids=["exactly-the-bound", "one-byte-over"])
def test_each_http_write_route_at_the_bound(srv: Server, route: str, over: int) -> None:
    """Every route and both sides of the bound, whatever the property drew."""
    ROUTES[route](srv, f"example-{route}-{over}", 'é€😀\n"', over)


@pytest.mark.parametrize("over", [0, 1], ids=["exactly-the-bound", "one-byte-over"])
def test_cli_ingest_at_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: int
) -> None:
    monkeypatch.setenv("ORRERY_MAX_RECORD_BYTES", str(BOUND))

    def size(n: int, k: int) -> int:
        return record_size(record_json("cli", "ü", n, k))

    n, k = fit(size, BOUND + over)
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(record_json("cli", "ü", n, k)) + "\n")
    result = CliRunner().invoke(app, ["ingest", str(path), "--data-dir", str(tmp_path / "d")])
    if over > 0:
        assert result.exit_code == 1, result.output
        assert "records.jsonl:1: record_too_large" in result.output.replace("\n", "")
        assert f"more than {BOUND}" in result.output.replace("\n", "")
    else:
        assert result.exit_code == 0, result.output
        assert "1 accepted" in result.output


@pytest.mark.parametrize("over", [0, 1], ids=["exactly-the-bound", "one-byte-over"])
def test_cli_import_jsonl_at_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: int
) -> None:
    monkeypatch.setenv("ORRERY_MAX_RECORD_BYTES", str(BOUND))

    def size(n: int, k: int) -> int:
        return import_size(import_row("cli-import", "ü", n, k))

    n, k = fit(size, BOUND + over)
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps(import_row("cli-import", "ü", n, k)) + "\n")
    result = CliRunner().invoke(
        app,
        [
            "import-jsonl",
            str(path),
            "--namespace",
            NS,
            "--data-dir",
            str(tmp_path / "d"),
            "--id-field",
            "id",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    if over > 0:
        assert (out["imported"], out["errors"]) == (0, 1)
        assert_too_large(out["errorLines"][0], BOUND + over)
    else:
        assert (out["imported"], out["errors"]) == (1, 0), out


@pytest.mark.servers
@pytest.mark.slow
def test_server_mode_takes_one_kafka_message_and_refuses_one_byte_more(
    tmp_path: Path,
) -> None:
    """The server-mode default (no ORRERY_MAX_RECORD_BYTES): 960 KiB, the largest record
    whose event fits one Kafka message; a record of exactly that is published and
    projected, one byte more is 413 before anything is written."""
    server = start_server(tmp_path / "data", env=server_env(run_tag()))
    try:
        for over, item in ((1, "kafka-over"), (0, "kafka-exact")):

            def size(n: int, k: int, item: str = item) -> int:
                return record_size(record_json(item, "", n, k))

            n, k = fit(size, KAFKA_MAX_RECORD_BYTES + over)
            answer = server.post_records([record_json(item, "", n, k)])
            if over:
                assert answer.status_code == 413, answer.text[:300]
                error = answer.json()["error"]
                assert error["code"] == "record_too_large"
                assert error["details"]["max_record_bytes"] == KAFKA_MAX_RECORD_BYTES
                assert error["details"]["record_bytes"] == KAFKA_MAX_RECORD_BYTES + 1
            else:
                assert answer.status_code == 200, answer.text[:300]
        # The record of exactly the bound went through Kafka and was indexed.
        server.wait_projected(timeout=600)
        found = server.topk(
            namespace=NS, scope_ref="longterm:objects:current", query_text="sized", result_limit=5
        )
        assert found.status_code == 200, found.text[:300]
        assert [r["item_id"] for r in found.json()["results"]] == ["kafka-exact"]
    finally:
        server.stop()
