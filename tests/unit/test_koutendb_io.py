"""The pure rules of KoutenDB import and dump: line mapping, line splitting, rings and
payload strings (ingest.koutendb_io, contracts.koutendb_io)."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.admission import MAX_RECORD_BYTES
from contracts.errors import ErrorCode
from contracts.koutendb_io import (
    RAW_PAYLOAD_SCHEMA,
    backup_name_problem,
    payload_codec,
    ring_closure,
)
from ingest.koutendb_io import ImportOptions, LineError, LineSplitter, map_line

OPTIONS = ImportOptions(
    namespace="ns",
    snapshot_kind="objects",
    galaxy="g",
    vector_dimension=2,
    max_record_bytes=MAX_RECORD_BYTES,
)


def line(row: object) -> bytes:
    return json.dumps(row).encode()


def test_blank_and_dump_meta_and_ring_lines_are_skipped() -> None:
    assert map_line(b"   \r", OPTIONS) is None
    assert map_line(line({"type": "meta", "format": "koutendb.dump.v1"}), OPTIONS) is None
    assert map_line(line({"type": "ring", "name": "a/b", "key": "1"}), OPTIONS) is None
    # A row that only looks like a ring line is a row.
    kept = map_line(line({"type": "ring", "name": "x", "body": "text"}), OPTIONS)
    assert kept is not None and kept["ring"] == "imported"


def test_document_lines_keep_ring_payload_codec_and_vector() -> None:
    doc = {"type": "document", "id": "7", "ring": "a/b", "payload": '{"k":1}', "codec": "json"}
    out = map_line(line({**doc, "vec": [1, 0]}), OPTIONS)
    assert out is not None
    assert (out["item_id"], out["ring"], out["payload"], out["vector"]) == (
        "g:7",
        "a/b",
        {"k": 1},
        [1.0, 0.0],
    )
    raw = map_line(line({**doc, "codec": "raw"}), OPTIONS)
    assert raw is not None and raw["payload"] == {"raw": '{"k":1}'}
    assert raw["payload_schema"] == RAW_PAYLOAD_SCHEMA and "vector" not in raw


def test_rows_are_routed_by_ring_field_prefix_payload_and_vector_fields() -> None:
    options = ImportOptions(
        namespace="ns",
        snapshot_kind="objects",
        galaxy="g",
        default_ring="misc",
        ring_field="meta.tenant",
        ring_prefix="t/",
        payload_field="body.text",
        vec_field="emb",
        id_field="_id",
        vector_dimension=2,
        max_record_bytes=MAX_RECORD_BYTES,
    )
    row = {"_id": 5, "meta": {"tenant": "a"}, "body": {"text": "hello"}, "emb": [0.5, 0.5]}
    out = map_line(line(row), options)
    assert out is not None
    assert (out["item_id"], out["ring"], out["payload"]) == ("g:5", "t/a", {"raw": "hello"})
    assert out["text"] == {"body": "hello"}
    fallback = map_line(line({"body": {"text": "x"}}), options)
    assert fallback is not None and fallback["ring"] == "t/misc"
    assert map_line(line({"body": {}}), options) is None  # no payload: skipped


def test_the_id_is_the_lines_sha256_without_an_id_field() -> None:
    text = line({"a": 1})
    out = map_line(b"  " + text + b"\r", OPTIONS)
    assert out is not None and out["item_id"] == "g:" + hashlib.sha256(text).hexdigest()


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{nope", ErrorCode.INVALID_JSON),
        (b"[1]", ErrorCode.INVALID_REQUEST),
        (b'{"a": NaN}', ErrorCode.INVALID_JSON),
        (line({"type": "document", "ring": 3, "payload": "x"}), ErrorCode.INVALID_REQUEST),
        (
            line({"type": "document", "ring": "", "payload": "{", "codec": "json"}),
            ErrorCode.INVALID_JSON,
        ),
        (
            line({"type": "document", "ring": "", "payload": "x", "vec": [1, 2, 3]}),
            ErrorCode.EMBEDDER_MISMATCH,
        ),
        (
            # Floats take the fast path; the dimension is checked all the same.
            line({"type": "document", "ring": "", "payload": "x", "vec": [1.5, 2.5, 3.5]}),
            ErrorCode.EMBEDDER_MISMATCH,
        ),
        (
            line({"type": "document", "ring": "", "payload": "x", "vec": ["a", 1]}),
            ErrorCode.INVALID_REQUEST,
        ),
        (
            line({"type": "document", "ring": "", "payload": "x", "id": [1]}),
            ErrorCode.INVALID_REQUEST,
        ),
    ],
)
def test_bad_lines_raise_a_line_error(raw: bytes, code: ErrorCode) -> None:
    with pytest.raises(LineError) as caught:
        map_line(raw, OPTIONS)
    assert caught.value.code is code


@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
    final_newline=st.booleans(),
)
def test_line_splitter_gives_the_same_lines_for_any_chunking(
    lines: list[bytes], cuts: list[int], final_newline: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    splitter = LineSplitter(max_line_bytes=1_000)
    out: list[bytes | None] = []
    points = sorted({c for c in cuts if c < len(data)} | {0, len(data)})
    for start, end in itertools.pairwise(points):
        out += splitter.feed(data[start:end])
    out += splitter.close()
    expected = data.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert out == expected


def test_line_splitter_reports_an_overlong_line_and_goes_on() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    out = splitter.feed(b"short\n" + b"x" * 8) + splitter.feed(b"y" * 30) + splitter.feed(b"\nok\n")
    assert out == [b"short", None, b"ok"]


def test_ring_closure_and_payload_codec() -> None:
    assert ring_closure(["a/b/c", "a/x", "", "d"]) == ["a", "a/b", "a/b/c", "a/x", "d"]
    assert payload_codec(RAW_PAYLOAD_SCHEMA, {"raw": "hi"}) == ("raw", "hi")
    assert payload_codec("", {"b": 1, "a": "é"}) == ("json", '{"a":"é","b":1}')


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "/abs", ".hidden", "a\\b", "x" * 129, "a..b"])
def test_backup_names_are_never_paths(bad: str) -> None:
    assert backup_name_problem(bad) is not None


def test_backup_names() -> None:
    assert backup_name_problem("nightly-2026.12.01_a") is None


def test_a_store_fault_stops_the_import_with_its_progress(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from ingest.adapters.sqlite_store import SqliteRecordStore
    from ingest.entrypoints.koutendb_http import create_router
    from orrery.http import build_app

    store = SqliteRecordStore(tmp_path / "orrery.sqlite")
    router = create_router(
        store=store,
        grants={},
        max_batch=1_000,
        vector_dimension=None,
        max_record_bytes=MAX_RECORD_BYTES,
        resolve_scope=lambda _ns, _ref: "objects",
    )
    app = build_app("t", [router], stream_paths=["/v1/koutendb/import"])
    body = b'{"a": 1}\n{"a": 2}\n{"a": 3}\n'
    with TestClient(app, raise_server_exceptions=False) as client:
        ok = client.post(
            "/v1/koutendb/import",
            params={"namespace": "ns", "batchSize": 2},
            content=body,
            headers={"content-type": "application/x-ndjson"},
        )
        assert ok.status_code == 200 and ok.json()["imported"] == 3
        store.close()  # the database goes away: a dependency fault, not a 500
        failed = client.post(
            "/v1/koutendb/import",
            params={"namespace": "ns", "batchSize": 2},
            content=body,
            headers={"content-type": "application/x-ndjson"},
        )
        assert failed.status_code == 503, failed.text
        error = failed.json()["error"]
        assert error["code"] == "dependency_unavailable"
        assert error["details"]["progress"]["imported"] == 0
        assert error["details"]["progress"]["read"] == 2


def test_imported_records_are_the_records_full_validation_makes(tmp_path: Path) -> None:
    """The importer validates a record's vector once (in `map_line`), not again in
    `Record`: what it writes is what `Record.model_validate` of the mapped line makes,
    and a vector past Record's bound is still refused with Record's own message."""
    from contracts.records import Record
    from ingest.adapters.sqlite_store import SqliteRecordStore
    from ingest.koutendb_io import JsonlImporter

    options = ImportOptions(
        namespace="ns",
        snapshot_kind="objects",
        galaxy="g",
        vec_field="v",
        id_field="k",
        max_record_bytes=MAX_RECORD_BYTES,
    )
    lines = [
        line({"k": "a", "v": [1, 2.5, -3]}),  # ints become floats
        line({"k": "b", "v": [0.25] * 4096}),
        line({"k": "c", "v": [0.5] * 4097}),  # past Record's bound
        line({"k": "d", "v": [0.125, 1e-7], "t": "x"}),
    ]
    store = SqliteRecordStore(tmp_path / "orrery.sqlite")
    try:
        importer = JsonlImporter(options, store)
        for raw in lines:
            importer.add(raw)
        importer.write_pending()
        result = importer.result()
        assert (result.imported, result.errors) == (3, 1)
        error = result.errorLines[0]
        assert (error.line, error.code) == (3, "invalid_request")
        assert error.message.startswith("vector: List should have at most 4096 items")
        stored = {r.item_id: r for r in store.live_records("ns", "objects", "g")}
        for raw in (lines[0], lines[1], lines[3]):
            mapped = map_line(raw, options)
            assert mapped is not None
            expected = Record.model_validate({**mapped, "revision": 1})
            got = stored[expected.item_id]
            assert got.model_dump(exclude={"metadata"}) == expected.model_dump(exclude={"metadata"})
            assert got.vector is not None and {type(x) for x in got.vector} == {float}
        assert stored["g:a"].vector == [1.0, 2.5, -3.0]
    finally:
        store.close()


class _CountingStore:
    """A `RecordStore` over SQLite that remembers each batch's size (to see batching)."""

    def __init__(self, path: Path) -> None:
        from ingest.adapters.sqlite_store import SqliteRecordStore

        self.inner = SqliteRecordStore(path)
        self.batches: list[int] = []

    def write(self, records: Any) -> Any:
        self.batches.append(len(records))
        return self.inner.write(records)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_batch_is_full_at_its_bytes_and_a_record_over_the_bound_is_an_error_line(
    tmp_path: Path,
) -> None:
    """Issue 22: an import's memory is bounded by bytes per batch, not lines (60 lines of
    15 MB in one batch once held +2,977 MiB), and a line whose record is over
    `max_record_bytes` is an error line (`record_too_large`), the import going on."""
    from ingest.koutendb_io import JsonlImporter

    options = ImportOptions(
        namespace="ns",
        snapshot_kind="objects",
        galaxy="g",
        id_field="k",
        batch_size=1_000,
        max_batch_bytes=250_000,
        max_record_bytes=400_000,
    )
    store = _CountingStore(tmp_path / "orrery.sqlite")
    try:
        importer = JsonlImporter(options, store)  # type: ignore[arg-type]
        sizes = [100_000] * 5 + [450_000] + [100_000] * 2
        for n, size in enumerate(sizes):
            if importer.add(line({"k": f"r{n}", "blob": "x" * size})):
                importer.write_pending()
        importer.write_pending()
        result = importer.result()
        assert (result.read, result.imported, result.errors) == (8, 7, 1)
        assert (result.errorLines[0].line, result.errorLines[0].code) == (6, "record_too_large")
        details = result.errorLines[0].details
        assert details is not None and details["max_record_bytes"] == 400_000
        assert details["record_bytes"] > 400_000
        assert result.errorLines[0].field == "payload"
        # Three lines of ~100 KB pass 250,000 bytes: batches of 3, then 2 + the big line
        # (refused before the store), then the last two.
        assert store.batches == [3, 2, 2]
    finally:
        store.inner.close()
