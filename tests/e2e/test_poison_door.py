"""The door refuses what no engine can apply (issue 22), on every write route of a real
`orrery serve` (embedded stack) and both CLI writers: `POST /v1/records`, ChonkyDB's
`records/bulk`, the KoutenDB import, `orrery ingest` and `orrery import-jsonl`.

A refused record answers 422 (a line of an import: an `errorLines` entry) naming the
field and a machine-readable reason, nothing of it is written (the log's high water does
not move for it), and a write after it is searchable as usual.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from contracts.admission import KEYWORD_MAX_BYTES
from orrery.cli import app
from tests.e2e.conftest import Server, start_server

NS = "door"
KIND = "objects"
SCOPE = "longterm:objects:current"
DIM = 384  # the real embedder's
NDJSON = {"content-type": "application/x-ndjson"}


def vec(first: float, rest: float = 0.0) -> list[float]:
    return [first, *[rest] * (DIM - 1)]


def rec(item: str, **fields: Any) -> dict[str, Any]:
    return {
        "namespace": NS,
        "snapshot_kind": KIND,
        "item_id": item,
        "revision": 1,
        "text": {"title": f"door {item}", "body": "a record at the door"},
        "metadata": {"status": "active", "updated_at": "2026-03-19T12:00:00Z"},
        **fields,
    }


# (record fields, the field refused, the reason): each a write no engine can apply.
POISON: list[tuple[dict[str, Any], list[Any], str]] = [
    ({"vector": [0.0] * DIM}, ["vector"], "vector_zero"),
    ({"vector": vec(1e39)}, ["vector"], "vector_not_finite"),
    ({"vector": [1e-46] * DIM}, ["vector"], "vector_zero"),
    ({"vector": [3e38] * DIM}, ["vector"], "vector_not_finite"),
    ({"vector": [1.0] * (DIM - 1)}, ["vector"], "embedder_mismatch"),
    (
        {"metadata": {"visibility": ["x" * (KEYWORD_MAX_BYTES + 1)]}},
        ["metadata", "visibility", 0],
        "keyword_too_long",
    ),
    (
        {"metadata": {"topic": ["ok", "y" * (KEYWORD_MAX_BYTES + 1)]}},
        ["metadata", "topic", 1],
        "keyword_too_long",
    ),
]
IDS = ["zero", "overflow", "underflow", "unnormalizable", "dimension", "label", "facet"]
# A record over the deployment's size bound (ORRERY_MAX_RECORD_BYTES) is 413
# record_too_large on every route: tests/e2e/test_record_size.py.


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("door") / "data")
    try:
        yield server
    finally:
        server.stop()


def high_water(srv: Server) -> int:
    return int(srv.client.get("/v1/readiness").json()["log_high_water"])


def found(srv: Server, text: str) -> list[str]:
    answer = srv.topk(namespace=NS, scope_ref=SCOPE, query_text=text, result_limit=10)
    assert answer.status_code == 200, answer.text
    return [r["item_id"] for r in answer.json()["results"]]


@pytest.mark.parametrize(("fields", "loc", "reason"), POISON, ids=IDS)
def test_post_records_refuses_with_422_naming_the_field(
    srv: Server, fields: dict[str, Any], loc: list[Any], reason: str
) -> None:
    before = high_water(srv)
    answer = srv.post_records([rec("fine-neighbour"), rec("poison", **fields)])
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    (bad,) = error["details"]["records"]
    assert bad["index"] == 1
    assert [(e["loc"], e["type"]) for e in bad["errors"]] == [(loc, reason)]
    assert high_water(srv) == before  # nothing of the batch was written


# ChonkyDB items carry no vector (the embedder computes one): their keywords only.
@pytest.mark.parametrize(("fields", "loc", "reason"), POISON[5:7], ids=IDS[5:7])
def test_chonkydb_bulk_refuses_with_422_naming_the_field(
    srv: Server, fields: dict[str, Any], loc: list[Any], reason: str
) -> None:
    metadata = {"twinr_namespace": NS, "twinr_snapshot_kind": KIND, **fields["metadata"]}
    before = high_water(srv)
    answer = srv.client.post(
        "/v1/external/records/bulk",
        json={"items": [{"payload": {"memory_id": "chonky-poison"}, "metadata": metadata}]},
    )
    assert answer.status_code == 422, answer.text
    (bad,) = answer.json()["error"]["details"]["records"]
    assert [(e["loc"], e["type"]) for e in bad["errors"]] == [(loc, reason)]
    assert high_water(srv) == before


def test_chonkydb_bulk_refuses_a_long_free_metadata_value(srv: Server) -> None:
    metadata = {"twinr_namespace": NS, "twinr_snapshot_kind": KIND, "note": "z" * 9_000}
    answer = srv.client.post(
        "/v1/external/records/bulk",
        json={"items": [{"payload": {"memory_id": "chonky-note"}, "metadata": metadata}]},
    )
    assert answer.status_code == 422, answer.text
    (bad,) = answer.json()["error"]["details"]["records"]
    assert [(e["loc"], e["type"]) for e in bad["errors"]] == [
        (["metadata", "note", 0], "keyword_too_long")
    ]


def test_koutendb_import_refuses_each_poison_line_and_imports_the_rest(srv: Server) -> None:
    lines = [
        {"id": "k-fine-1", "text": "kouten fine one", "vec": vec(1.0)},
        {"id": "k-zero", "text": "kouten zero", "vec": [0.0] * DIM},
        {"id": "k-overflow", "text": "kouten overflow", "vec": vec(1e39)},
        {"id": "k-dimension", "text": "kouten short", "vec": [1.0, 2.0]},
        {"id": "k-fine-2", "text": "kouten fine two"},
    ]
    body = "\n".join(json.dumps(line) for line in lines).encode()
    answer = srv.client.post(
        "/v1/koutendb/import",
        params={"namespace": NS, "vecField": "vec", "idField": "id"},
        content=body,
        headers=NDJSON,
    )
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert (out["imported"], out["errors"]) == (2, 3)
    refused = {(e["line"], e["field"], e["reason"]) for e in out["errorLines"]}
    assert refused == {
        (2, "vector", "vector_zero"),
        (3, "vector", "vector_not_finite"),
        (4, "vector", "embedder_mismatch"),
    }
    assert {e["code"] for e in out["errorLines"]} == {"invalid_request", "embedder_mismatch"}
    srv.wait_projected()
    assert {"default:k-fine-1", "default:k-fine-2"} <= set(found(srv, "kouten fine"))


def test_a_write_after_refusals_is_searchable(srv: Server) -> None:
    assert (
        srv.post_records([rec("after-the-door", text={"title": "pelican after door"})]).status_code
        == 200
    )
    srv.wait_projected()
    assert "after-the-door" in found(srv, "pelican")
    # No refused record reached the projector: nothing was dead-lettered.
    listed = CliRunner().invoke(app, ["project", "--dead-letters", "--data-dir", str(srv.data_dir)])
    assert listed.exit_code == 0, listed.output
    assert listed.output.strip() == ""


def test_cli_ingest_refuses_a_file_holding_a_poison_record(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    path = tmp_path / "records.jsonl"
    path.write_text(
        json.dumps(rec("cli-fine", vector=vec(1.0)))
        + "\n"
        + json.dumps(rec("cli-zero", vector=[0.0] * DIM))
        + "\n"
    )
    result = CliRunner().invoke(app, ["ingest", str(path), "--data-dir", str(data_dir)])
    assert result.exit_code == 1
    assert "records.jsonl:2: vector:" in result.output and "(vector_zero)" in result.output
    assert not (data_dir / "orrery.sqlite").exists() or _no_records(data_dir)


def _no_records(data_dir: Path) -> bool:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(data_dir / "orrery.sqlite")) as conn:
        try:
            return int(conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]) == 0
        except sqlite3.OperationalError:
            return True


def test_cli_import_jsonl_refuses_poison_lines(tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    path.write_text(
        json.dumps({"id": "c1", "text": "cli import fine", "vec": vec(1.0)})
        + "\n"
        + json.dumps({"id": "c2", "text": "cli import overflow", "vec": vec(-1e39)})
        + "\n"
    )
    result = CliRunner().invoke(
        app,
        [
            "import-jsonl",
            str(path),
            "--namespace",
            NS,
            "--data-dir",
            str(tmp_path / "data"),
            "--vec-field",
            "vec",
            "--id-field",
            "id",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert (out["imported"], out["errors"]) == (1, 1)
    (line,) = out["errorLines"]
    assert (line["line"], line["field"], line["reason"]) == (2, "vector", "vector_not_finite")
