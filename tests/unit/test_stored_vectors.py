"""Decoded events keep their vector's text and float32 values (`contracts.events.
decode_record_changed`, `contracts.stored_vectors`): the decoded event equals the whole
validation's (the same float64 values, the same error for anything else); the Qdrant
body built from it is byte for byte the old one; the ring statistics take the same
float32 values; a vector whose text does not fit stays a plain list."""

from __future__ import annotations

import json
from array import array
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_core import to_json

from contracts.events import RecordChanged, decode_record_changed, record_changed_json
from contracts.index import IndexDocument, to_index_document
from contracts.records import vector_json, vector_text
from contracts.stored_vectors import StoredVector, float32_bytes, stored_vector
from contracts.vector_payload import point_key
from projector.adapters.qdrant_vectors import _SPLICE, _body_json, _upsert_json
from projector.dead_letters import rejected_value
from projector.ports import RejectedRecord
from projector.ring_stats import ring_moves
from tests.json_strategies import TEXT as _TEXT
from tests.json_strategies import tricky_json
from tests.unit.vector_records import changed_event as _event
from tests.unit.vector_records import vector_record as _record

_JSON = tricky_json(10)
# float64 values, not only float32 ones: what a client sends.
_VECTORS = st.lists(
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=12
)


@settings(max_examples=300, deadline=None)
@given(
    payload=st.dictionaries(_TEXT, _JSON, max_size=4),
    vector=st.one_of(st.none(), _VECTORS),
    lanes=st.sampled_from([None, [], ["lexical"], ["vector"], ["lexical", "vector"]]),
    deleted=st.booleans(),
)
def test_the_decoded_event_is_the_whole_validations(
    payload: dict[str, Any], vector: list[float] | None, lanes: list[str] | None, deleted: bool
) -> None:
    raw = _event(_record(payload, vector, index_lanes=lanes, deleted=deleted))
    old = RecordChanged.model_validate_json(raw)
    new = decode_record_changed(raw)
    assert new == old
    # The text of a SQLite outbox row is cut as text, a Kafka value as bytes: the same.
    as_text = decode_record_changed(raw.decode())
    assert as_text == new and type(as_text.record.vector) is type(new.record.vector)
    if isinstance(new.record.vector, StoredVector):
        assert isinstance(as_text.record.vector, StoredVector)
        assert as_text.record.vector.json == new.record.vector.json
    assert new.record.model_fields_set == old.record.model_fields_set
    assert new.model_dump_json() == old.model_dump_json()  # what a dead letter keeps
    if vector is None or deleted:
        assert not isinstance(new.record.vector, StoredVector)
        return
    stored = new.record.vector
    assert isinstance(stored, StoredVector)
    assert list(stored) == old.record.vector  # the float64 values themselves
    assert stored.json == to_json(old.record.vector)
    assert stored.float32.dtype == np.float32
    assert np.array_equal(stored.float32, np.asarray(old.record.vector, dtype=np.float32))
    assert not stored.float32.flags.writeable


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{}",
        b'{"event_type":"record_changed","record":{}}',
        b'{"event_type":"other","record":{"namespace":"ns"}}',
        b'{"event_type":"record_changed","record":{"namespace":"ns","snapshot_kind":"k",'
        b'"item_id":"i","revision":1,"vector":[1,"2"]}}',
    ],
)
def test_what_is_no_event_is_the_same_error(raw: bytes) -> None:
    with pytest.raises(ValidationError) as old:
        RecordChanged.model_validate_json(raw)
    with pytest.raises(ValidationError) as new:
        decode_record_changed(raw)
    assert new.value.errors() == old.value.errors()


def test_another_layout_keeps_a_plain_list() -> None:
    record = _record({}, [0.5, -0.25])
    spaced = json.dumps(json.loads(record_changed_json(record.model_dump_json())))  # ", "
    decoded = decode_record_changed(spaced)
    assert decoded.record.vector == [0.5, -0.25]
    assert not isinstance(decoded.record.vector, StoredVector)


def test_stored_vector_takes_number_text_only() -> None:
    assert stored_vector([1.0, 2.0], b"[1.0,2.0]") is not None
    assert stored_vector([1.0, 2.5e-7], b"[1,-2.5E-07]") is not None
    assert stored_vector([1.0, 2.0], b'[1.0,"2"]') is None
    assert stored_vector([1.0, 2.0], b"[1.0, 2.0]") is None
    assert stored_vector([1.0, 2.0], b"[1.0,{2.0]") is None
    assert stored_vector([1.0, 2.0], b"1.0,2.0") is None


def test_float32_rounds_as_numpy_and_overflows_to_infinity() -> None:
    values = [0.1, -1e-50, 1 / 3, 16777217.0, 3.4028235677973366e38, -1e39]
    stored = stored_vector(values, to_json(values))
    assert stored is not None
    with np.errstate(over="ignore"):
        expected = np.asarray(values, dtype=np.float32)
    assert stored.float32.tobytes() == expected.tobytes()
    assert stored.float32[3] == 16777216.0 and np.isinf(stored.float32[4:]).all()


@settings(max_examples=150, deadline=None)
@given(
    vectors=st.lists(_VECTORS, min_size=1, max_size=6),
    payload=st.dictionaries(_TEXT, _JSON, max_size=2),
    key=st.sampled_from((None, "s0c0")),
)
def test_the_qdrant_body_of_stored_vectors_is_the_old_bytes(
    vectors: list[list[float]], payload: dict[str, Any], key: str | None
) -> None:
    old: dict[str, IndexDocument] = {}
    new: dict[str, IndexDocument] = {}
    for i, vector in enumerate(vectors):
        record = _record(payload, vector, item_id=f"item-{i}", revision=1 + i % 2)
        decoded = decode_record_changed(_event(record)).record
        assert isinstance(decoded.vector, StoredVector)
        pid = point_key(record.doc_id)
        old[pid] = to_index_document(record, tuple(vector))
        new[pid] = to_index_document(decoded, decoded.vector)
        assert new[pid].vector is decoded.vector
    before = to_json({"operations": _upsert_json(old, key)})
    assert _body_json({"operations": _upsert_json(new, key)}) == before


@settings(max_examples=150, deadline=None)
@given(
    points=st.lists(
        st.tuples(_VECTORS, st.booleans(), st.integers(1, 3), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    key=st.sampled_from((None, "s0c0")),
)
def test_a_body_of_encoded_and_plain_vectors_is_the_plain_bytes(
    points: list[tuple[list[float], bool, int, bool]], key: str | None
) -> None:
    # Several revisions (one upsert operation each), vectors with and without their text,
    # and the splice token itself as a facet value (the count differs: the values are
    # serialized instead): always the body of the plain values.
    plain: dict[str, IndexDocument] = {}
    mixed: dict[str, IndexDocument] = {}
    for i, (vector, encoded, revision, token) in enumerate(points):
        metadata = {"updated_at": "2026-01-01T00:00:00Z", **({"room": _SPLICE} if token else {})}
        record = _record({}, vector, item_id=f"item-{i}", revision=revision, metadata=metadata)
        decoded = decode_record_changed(_event(record)).record
        assert isinstance(decoded.vector, StoredVector)
        pid = point_key(record.doc_id)
        plain[pid] = to_index_document(record, tuple(vector))
        mixed[pid] = to_index_document(decoded, decoded.vector if encoded else tuple(vector))
    operations = _upsert_json(mixed, key)
    assert _body_json({"operations": operations}) == to_json(
        {"operations": _upsert_json(plain, key)}
    )


def test_the_splice_token_elsewhere_falls_back_to_the_values() -> None:
    metadata = {"updated_at": "2026-01-01T00:00:00Z", "room": _SPLICE}
    record = _record({}, [0.5, -0.25], metadata=metadata)
    decoded = decode_record_changed(_event(record)).record
    writes = {point_key(record.doc_id): to_index_document(decoded, decoded.vector)}
    raw = _body_json({"operations": _upsert_json(writes)})
    point = json.loads(raw)["operations"][0]["upsert"]["points"][0]
    assert point["vector"] == {"dense": [0.5, -0.25]}
    assert _SPLICE in raw.decode()  # the facet, kept as it is


@settings(max_examples=100, deadline=None)
@given(
    vectors=st.integers(1, 8).flatmap(
        lambda n: st.lists(
            st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=n, max_size=n),
            min_size=1,
            max_size=5,
        )
    )
)
def test_ring_moves_take_the_same_float32_values(vectors: list[list[float]]) -> None:
    old: dict[str, tuple[int, IndexDocument | None]] = {}
    new: dict[str, tuple[int, IndexDocument | None]] = {}
    for i, vector in enumerate(vectors):
        record = _record({}, vector, item_id=f"item-{i}", ring="docs")
        decoded = decode_record_changed(_event(record)).record
        old[record.doc_id] = (1, to_index_document(record, tuple(vector)))
        new[record.doc_id] = (1, to_index_document(decoded, decoded.vector))
    old_rows, old_deltas = ring_moves(old, {})
    new_rows, new_deltas = ring_moves(new, {})
    assert old_rows == new_rows
    assert old_deltas.keys() == new_deltas.keys()
    for key, delta in old_deltas.items():
        assert delta.documents == new_deltas[key].documents
        assert delta.vector_sum is not None and delta.unit_sum is not None
        assert np.array_equal(delta.vector_sum, new_deltas[key].vector_sum)
        assert np.array_equal(delta.unit_sum, new_deltas[key].unit_sum)


def test_a_dead_letter_keeps_the_event_as_it_was() -> None:
    record = _record({}, [0.1, 0.2, 0.30000000000000004])
    raw = _event(record)
    decoded = decode_record_changed(raw).record
    assert isinstance(decoded.vector, StoredVector)
    assert rejected_value(RejectedRecord(7, decoded, "vector_zero", "why")) == raw


@settings(max_examples=300, deadline=None)
@given(
    record_json=st.one_of(
        st.builds(
            lambda p, v, lanes, d: _record(p, v, index_lanes=lanes, deleted=d).model_dump_json(),
            st.dictionaries(_TEXT, _JSON, max_size=3),
            st.one_of(st.none(), _VECTORS),
            st.sampled_from([None, [], ["vector"]]),
            st.booleans(),
        ),
        # Not a record's layout, but around its landmarks (a vector key nested in the
        # payload, a bracket inside a string, a tail that is not the end).
        st.lists(st.one_of(_TEXT, st.sampled_from(['"', "[1,2]", "}", ",", "é"])), max_size=8)
        .map("".join)
        .map(lambda middle: '{"a":' + middle + "}"),
    ),
    before=st.sampled_from(["", '{"event_type":"record_changed","record":', "ü"]),
    after=st.sampled_from(["", "}", "]}"]),
)
def test_vector_json_cuts_in_place_what_vector_text_cuts(
    record_json: str, before: str, after: str
) -> None:
    text = vector_text(record_json)
    raw = (before + record_json + after).encode("utf-8", "surrogatepass")
    start = len(before.encode())
    cut = vector_json(raw, start, len(raw) - len(after.encode()))
    expected = None if text is None else text.encode("utf-8", "surrogatepass")
    assert cut == expected


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.floats(),  # NaN, infinities, and values past float32's range
            st.floats(-4e38, 4e38),
            st.sampled_from([3.4028235677973366e38, -3.4028235677973366e38, 1e-46, -0.0]),
        ),
        max_size=20,
    )
)
def test_float32_bytes_is_cs_conversion(values: list[float]) -> None:
    assert float32_bytes(values) == array("f", values).tobytes()


# Every length class `vector_problem` tells apart: zero and subnormal vectors, float32's
# edge (|x| near 3.4e38), past it, and past float64's sum of squares.
_EDGE_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e-45, 1e-38, 1e-20, 3.4e38, 3.5e38, 1e154, 1e200]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_EDGE_FLOATS, min_size=1, max_size=16), st.sampled_from([None, 1, 4, 16]))
def test_a_stored_vector_is_refused_as_its_list_is(values: list[float], dimension: Any) -> None:
    """`vector_problem` of a decoded event's vector (measured once, when it was decoded)
    is what it says of the same values as a plain list."""
    from contracts.admission import vector_problem

    stored = stored_vector(values, json.dumps(values, separators=(",", ":")).encode())
    assert stored is not None and type(stored) is StoredVector
    assert vector_problem(stored, dimension) == vector_problem(list(values), dimension)
