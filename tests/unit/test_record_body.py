"""A stored record's JSON without its vector: cut as text from the writer's layout
(`contracts.records.record_json_without_vector`), kept beside the whole JSON by the
SQLite store (`record_body`) and read by the query side's record reader, including rows
written before that column existed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.records import Record, record_json_without_vector
from ingest.adapters.sqlite_store import SqliteRecordStore
from query.adapters.sqlite_routing import SqliteRecordReader
from tests.json_strategies import TEXT as _TEXT
from tests.json_strategies import tricky_json

_JSON = tricky_json(12)


def _record(payload: dict[str, Any], vector: list[float] | None, **extra: Any) -> Record:
    return Record.model_validate(
        {
            "namespace": "ns",
            "snapshot_kind": "objects",
            "item_id": "item-1",
            "revision": 1,
            "payload": payload,
            "vector": vector,
            **extra,
        }
    )


@settings(max_examples=300, deadline=None)
@given(
    payload=st.dictionaries(_TEXT, _JSON, max_size=4),
    vector=st.one_of(
        st.none(),
        st.lists(st.floats(-1.0, 1.0, allow_nan=False, width=32), min_size=1, max_size=8),
    ),
    lanes=st.sampled_from([None, [], ["lexical"], ["vector"], ["lexical", "vector"]]),
    deleted=st.booleans(),
)
def test_the_cut_is_json_remove_of_the_vector(
    payload: dict[str, Any], vector: list[float] | None, lanes: list[str] | None, deleted: bool
) -> None:
    whole = _record(payload, vector, index_lanes=lanes, deleted=deleted).model_dump_json()
    cut = record_json_without_vector(whole)
    expected = json.loads(whole)
    del expected["vector"]
    assert json.loads(cut) == expected
    # The same value SQLite's json_remove gives (what the reader selected before).
    with sqlite3.connect(":memory:") as conn:
        removed = conn.execute("SELECT json_remove(?, '$.vector')", (whole,)).fetchone()[0]
    assert json.loads(cut) == json.loads(removed)


def test_a_nested_vector_key_is_never_the_one_cut() -> None:
    whole = _record({"vector": [1, 2], "x": {"vector": None}}, [0.5, -0.25]).model_dump_json()
    cut = json.loads(record_json_without_vector(whole))
    assert "vector" not in cut
    assert cut["payload"] == {"vector": [1, 2], "x": {"vector": None}}


def test_another_layout_is_parsed_and_rendered_again() -> None:
    foreign = json.dumps({"vector": [0.1, 0.2], "payload": {"a": 1}, "text": {"body": "é"}})
    assert json.loads(record_json_without_vector(foreign)) == {
        "payload": {"a": 1},
        "text": {"body": "é"},
    }
    assert json.loads(record_json_without_vector('{"payload":{}}')) == {"payload": {}}


_OLD_RECORDS = """
CREATE TABLE records (
    document_id TEXT NOT NULL, revision INTEGER NOT NULL, namespace TEXT NOT NULL,
    snapshot_kind TEXT NOT NULL, item_id TEXT NOT NULL, galaxy TEXT NOT NULL,
    deleted INTEGER NOT NULL, payload_sha256 TEXT NOT NULL, record_json TEXT NOT NULL,
    accepted_at TEXT NOT NULL, PRIMARY KEY (document_id, revision)
)
"""


def test_the_reader_answers_rows_written_before_the_body_column(tmp_path: Path) -> None:
    db = tmp_path / "orrery.sqlite"
    old = _record({"k": "old"}, [0.1, 0.2, 0.3])
    with sqlite3.connect(db) as conn:
        conn.execute(_OLD_RECORDS)
        conn.execute(
            "INSERT INTO records VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                old.doc_id,
                1,
                "ns",
                "objects",
                "item-1",
                "default",
                0,
                "x",
                old.model_dump_json(),
                "",
            ),
        )
    reader = SqliteRecordReader(db)
    before = reader.fetch([(old.doc_id, 1)])[(old.doc_id, 1)]
    assert "vector" not in json.loads(before.record_json)
    assert json.loads(before.record_json)["payload"] == {"k": "old"}

    store = SqliteRecordStore(db)  # opening migrates: the column is added, old rows NULL
    new = _record({"k": "new"}, [0.4, 0.5], item_id="item-2")
    store.write([new])
    with sqlite3.connect(db) as conn:
        bodies = dict(conn.execute("SELECT item_id, record_body FROM records").fetchall())
    assert bodies["item-1"] is None
    assert json.loads(bodies["item-2"]) == {
        k: v for k, v in json.loads(new.model_dump_json()).items() if k != "vector"
    }
    both = SqliteRecordReader(db).fetch([(old.doc_id, 1), (new.doc_id, 1)])
    assert json.loads(both[(old.doc_id, 1)].record_json) == json.loads(before.record_json)
    assert json.loads(both[(new.doc_id, 1)].record_json) == json.loads(bodies["item-2"])
    # The reader that first saw the old table learns the column once it exists.
    assert json.loads(reader.fetch([(new.doc_id, 1)])[(new.doc_id, 1)].record_json)["payload"] == {
        "k": "new"
    }
