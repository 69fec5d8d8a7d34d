"""The vector read from its float32 bytes (`contracts.stored_vectors.PackedVector`, the
`orrery-vector-f32` header): the decoded event is the one decoded from the decimals
(the same float64 values when read, the same fields, the same error for anything
else); the projector's admission refuses exactly what it refused from the decimals
(NaN, infinities, values past float32's range, zero and too-short vectors, another
dimension); bytes that cannot be that text's vector are ignored; the engines get the
same bodies and arrays; a dead letter keeps the event as it was."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_core import to_json

from contracts.admission import record_problems, vector_problem
from contracts.events import (
    POSITION_HEADER,
    VECTOR_HEADER,
    RecordChanged,
    decode_record_changed,
)
from contracts.index import IndexDocument, to_index_document
from contracts.stored_vectors import (
    PackedVector,
    StoredVector,
    float32_wire,
    is_encoded,
    packed_vector,
)
from contracts.vector_payload import point_key
from ingest.adapters.kafka_wire import headers_of
from ingest.model import vector_wire
from ingest.relay_ports import OutboxRow
from projector.adapters.kafka_wire import decode_message
from projector.adapters.qdrant_vectors import _body_json, _upsert_json
from projector.dead_letters import rejected_value
from projector.ports import RejectedRecord
from projector.ring_stats import ring_moves
from tests.json_strategies import TEXT as _TEXT
from tests.json_strategies import tricky_json
from tests.unit.vector_records import changed_event as _event
from tests.unit.vector_records import vector_record as _record

_JSON = tricky_json(10)
# Every length class `vector_problem` tells apart: zero and subnormal vectors, float32's
# edge (|x| near 3.4e38), past it (an infinity in float32), and past float64's sum of
# squares; and plain values.
_EDGE_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(-1e3, 1e3, allow_nan=False),
    st.sampled_from(
        [0.0, -0.0, 1e-45, 1e-38, 1e-20, 6e-8, 1.2e-7, 1e19, 1.8e19, 3.4e38, 3.5e38, 1e154, 1e200]
    ),
)
_VECTORS = st.lists(_EDGE_FLOATS, min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    payload=st.dictionaries(_TEXT, _JSON, max_size=4),
    vector=st.one_of(st.none(), _VECTORS),
    lanes=st.sampled_from([None, [], ["lexical"], ["vector"], ["lexical", "vector"]]),
    deleted=st.booleans(),
    dimension=st.sampled_from([None, 1, 3, 12]),
)
def test_the_packed_event_is_the_decimals_event_and_refused_alike(
    payload: dict[str, Any],
    vector: list[float] | None,
    lanes: list[str] | None,
    deleted: bool,
    dimension: int | None,
) -> None:
    record = _record(payload, vector, index_lanes=lanes, deleted=deleted)
    raw = _event(record)
    wire = vector_wire(record)
    old = decode_record_changed(raw)
    new = decode_record_changed(raw, wire if wire is not None else float32_wire([1.0]))
    assert new == old
    assert new.record.model_fields_set == old.record.model_fields_set
    assert new.record.model_dump(exclude={"vector"}) == old.record.model_dump(exclude={"vector"})
    # The projector's admission says the same of both, word for word.
    assert record_problems(new.record, dimension=dimension) == record_problems(
        old.record, dimension=dimension
    )
    if vector is None or deleted:
        assert wire is None
        assert not isinstance(new.record.vector, PackedVector)
        return
    packed = new.record.vector
    assert isinstance(packed, PackedVector) and is_encoded(packed)
    assert isinstance(old.record.vector, StoredVector)
    assert len(packed) == len(vector)
    assert packed.json == old.record.vector.json == to_json(vector)
    assert packed.float32.dtype == np.float32 and not packed.float32.flags.writeable
    assert packed.float32.tobytes() == old.record.vector.float32.tobytes()
    assert packed.values() == list(old.record.vector) == vector  # the float64 values
    assert list(packed) == vector and packed[0] == vector[0]


@settings(max_examples=500, deadline=None)
@given(
    values=st.lists(
        st.one_of(_EDGE_FLOATS, st.floats(), st.floats(-4e38, 4e38)), min_size=1, max_size=16
    ),
    dimension=st.sampled_from([None, 1, 4, 16]),
)
def test_admission_on_float32_refuses_what_it_refused_from_the_values(
    values: list[float], dimension: int | None
) -> None:
    """NaN, infinities (given, or a finite float64 past float32's range), zero and
    too-short vectors, lengths whose square overflows float32, another dimension: the
    problem of the float32 bytes is the problem of the float64 values, word for word."""
    packed = PackedVector(np.frombuffer(float32_wire(values), dtype="<f4"), b"[]")
    assert vector_problem(packed, dimension) == vector_problem(list(values), dimension)


def test_the_length_bounds_are_measured_exactly() -> None:
    """Around `vector_problem`'s bounds (float32 epsilon, float32's largest square) the
    float32 vector is measured by `math.hypot`, as the values were."""
    from contracts.admission import FLOAT32_EPSILON

    edge = math.sqrt(3.4028234663852886e38)
    for values in (
        [FLOAT32_EPSILON],
        [np.nextafter(np.float32(FLOAT32_EPSILON), np.float32(0)).item()],
        [edge],
        [float(np.float32(edge))],
        [float(np.nextafter(np.float32(edge), np.float32(np.inf)))],
        [3e-8, 3e-8, 3e-8, 3e-8],
    ):
        packed = PackedVector(np.frombuffer(float32_wire(values), dtype="<f4"), b"[]")
        assert vector_problem(packed, None) == vector_problem(values, None), values


@pytest.mark.parametrize(
    ("wire", "text"),
    [
        (float32_wire([1.0, 2.0]), b"[1.0,2.0,3.0]"),  # another dimension
        (float32_wire([1.0, 2.0, 3.0]), b"[1.0,2.0]"),
        (float32_wire([1.0, 2.0]) + b"\x00", b"[1.0,2.0]"),  # not whole float32s
        (b"", b"[1.0]"),
        (float32_wire([1.0, 2.0]), b"[1.0, 2.0]"),  # not number characters
        (float32_wire([1.0, 2.0]), b'[1.0,"2"]'),
        (float32_wire([1.0, 2.0]), b"[1.0,{2]"),
        (float32_wire([1.0, 2.0]), b"[1,]"),  # too short for two values
        (float32_wire([1.0] * 4_097), b"[" + b",".join([b"1.0"] * 4_097) + b"]"),
    ],
)
def test_bytes_that_are_not_the_texts_vector_are_ignored(wire: bytes, text: bytes) -> None:
    assert packed_vector(wire, text) is None


def test_an_event_whose_bytes_do_not_fit_decodes_from_its_decimals() -> None:
    record = _record({}, [0.5, -0.25, 1.0])
    raw = _event(record)
    for wire in (float32_wire([0.5, -0.25]), b"\x00" * 13, b""):
        decoded = decode_record_changed(raw, wire)
        assert isinstance(decoded.record.vector, StoredVector)
        assert decoded == RecordChanged.model_validate_json(raw)
    # Another layout (spaces): the bytes are not used either.
    spaced = json.dumps(json.loads(raw)).encode()
    decoded = decode_record_changed(spaced, vector_wire(record))
    assert decoded.record.vector == [0.5, -0.25, 1.0]
    assert not isinstance(decoded.record.vector, PackedVector)


def test_a_second_vector_key_is_decoded_from_the_decimals() -> None:
    """A record holding `vector` twice (the last wins in the whole validation): without
    the cut one, the first would be left; the event is decoded whole instead."""
    record = _record({}, [0.5, -0.25])
    raw = _event(record).replace(b'"payload":{}', b'"vector":[9.0,9.0],"payload":{}')
    decoded = decode_record_changed(raw, vector_wire(record))
    assert decoded == RecordChanged.model_validate_json(raw)
    assert list(decoded.record.vector or []) == [0.5, -0.25]
    assert not isinstance(decoded.record.vector, PackedVector)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{}",
        b'{"event_type":"record_changed","record":{}}',
        b'{"event_type":"other","record":{"namespace":"ns","vector":[1.0]}}',
        b'{"event_type":"record_changed","record":{"namespace":"ns","snapshot_kind":"k",'
        b'"item_id":"","revision":1,"vector":[1.0]}}',
        b'{"event_type":"record_changed","record":{"namespace":"ns","snapshot_kind":"k",'
        b'"item_id":"i","revision":"1","vector":[1.0]}}',
        b'{"event_type":"record_changed","record":{"namespace":"ns","snapshot_kind":"k",'
        b'"item_id":"i","revision":1,"extra":1,"vector":[1.0]}}',
    ],
)
def test_what_is_no_event_is_the_same_error_with_bytes(raw: bytes) -> None:
    with pytest.raises(ValidationError) as old:
        RecordChanged.model_validate_json(raw)
    with pytest.raises(ValidationError) as new:
        decode_record_changed(raw, float32_wire([1.0]))
    assert new.value.errors() == old.value.errors()


def test_the_wire_is_little_endian_float32_of_the_values() -> None:
    values = [0.1, -1e-50, 1 / 3, 16777217.0, 1e39]
    with np.errstate(over="ignore"):
        expected = np.asarray(values, dtype="<f4").tobytes()
    assert float32_wire(values) == expected
    record = _record({}, values)
    assert vector_wire(record) == expected
    assert vector_wire(_record({}, None)) is None
    assert vector_wire(_record({}, values, deleted=True)) is None


def test_the_relay_ships_the_bytes_and_the_projector_reads_them() -> None:
    record = _record({}, [0.5, -0.25])
    raw = _event(record)
    row = OutboxRow(7, record.doc_id, "ns", raw.decode(), None, vector_wire(record))
    headers = headers_of(row)
    assert (VECTOR_HEADER, vector_wire(record)) in headers
    assert VECTOR_HEADER not in dict(headers_of(row._replace(vector_f32=None)))
    entry = decode_message("t", 0, 3, record.doc_id.encode(), raw, headers)
    assert not hasattr(entry, "reason")
    assert isinstance(entry.event.record.vector, PackedVector)  # type: ignore[union-attr]
    assert entry.position == 7
    # A message from before (no header) decodes from the decimals.
    old = decode_message("t", 0, 3, None, raw, [(POSITION_HEADER, b"7")])
    assert isinstance(old.event.record.vector, StoredVector)  # type: ignore[union-attr]
    assert old == entry


@settings(max_examples=100, deadline=None)
@given(
    vectors=st.lists(
        st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=3, max_size=3),
        min_size=1,
        max_size=5,
    ),
    key=st.sampled_from((None, "s0c0")),
)
def test_the_engines_get_the_same_body_and_arrays(
    vectors: list[list[float]], key: str | None
) -> None:
    old: dict[str, IndexDocument] = {}
    new: dict[str, IndexDocument] = {}
    old_docs: dict[str, tuple[int, IndexDocument | None]] = {}
    new_docs: dict[str, tuple[int, IndexDocument | None]] = {}
    for i, vector in enumerate(vectors):
        record = _record({}, vector, item_id=f"item-{i}", ring="docs")
        decoded = decode_record_changed(_event(record), vector_wire(record)).record
        assert isinstance(decoded.vector, PackedVector)
        pid = point_key(record.doc_id)
        old[pid] = to_index_document(record, tuple(vector))
        new[pid] = to_index_document(decoded, decoded.vector)
        assert new[pid].vector is decoded.vector
        old_docs[record.doc_id] = (1, old[pid])
        new_docs[record.doc_id] = (1, new[pid])
    before = to_json({"operations": _upsert_json(old, key)})
    assert _body_json({"operations": _upsert_json(new, key)}) == before
    old_rows, old_deltas = ring_moves(old_docs, {})
    new_rows, new_deltas = ring_moves(new_docs, {})
    assert old_rows == new_rows
    for ring, delta in old_deltas.items():
        assert np.array_equal(delta.vector_sum, new_deltas[ring].vector_sum)
        assert np.array_equal(delta.unit_sum, new_deltas[ring].unit_sum)


def test_a_dead_letter_keeps_the_event_as_it_was() -> None:
    record = _record({}, [0.1, 0.2, 0.30000000000000004, 0.0])
    raw = _event(record)
    decoded = decode_record_changed(raw, vector_wire(record)).record
    assert isinstance(decoded.vector, PackedVector)
    assert rejected_value(RejectedRecord(7, decoded, "vector_zero", "why")) == raw


@settings(max_examples=200, deadline=None)
@given(vector=_VECTORS, parsed=st.booleans())
def test_a_pickled_packed_vector_is_the_same_vector(vector: list[float], parsed: bool) -> None:
    """The write workers' hand-over pickles packed vectors (`PackedVector.__reduce__`):
    the same float32 bytes, read-only in native order, the same text, length and values."""
    import pickle

    text = json.dumps(vector, separators=(",", ":")).encode()
    packed = packed_vector(float32_wire(vector), text)
    assert packed is not None
    if parsed:
        packed.values()
    copy = pickle.loads(pickle.dumps(packed, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(copy) is PackedVector
    assert copy.float32.dtype == packed.float32.dtype
    assert copy.float32.tobytes() == packed.float32.tobytes()
    assert not copy.float32.flags.writeable
    assert copy.json == packed.json
    assert copy.length == packed.length or (math.isnan(copy.length) and math.isnan(packed.length))
    assert copy.values() == packed.values()
    assert list(copy) == list(packed)


def _fits_before(wire: bytes, text: bytes) -> bool:
    """`packed_vector`'s test of `text` against `wire` as it was before session 28 (the
    inside of the brackets copied, then translated): the reference."""
    count, rest = divmod(len(wire), 4)
    return not (
        rest
        or not 1 <= count <= 4_096
        or text[:1] != b"["
        or text[-1:] != b"]"
        or len(text) < 2 * count + 1
        or text[1:-1].translate(None, b"0123456789.eE+-") != b"," * max(count - 1, 0)
    )


@settings(max_examples=400, deadline=None)
@given(
    count=st.integers(min_value=0, max_value=6),
    text=st.one_of(
        st.lists(
            st.sampled_from([b"1", b"0.5", b"-2e3", b"", b",", b"[", b"]", b" ", b'"', b"x"]),
            max_size=14,
        ).map(b"".join),
        st.binary(max_size=24),
    ),
    bracket=st.booleans(),
)
def test_the_text_is_taken_exactly_when_it_was(count: int, text: bytes, bracket: bool) -> None:
    """The check without the copy of the list's inside takes the same texts as before."""
    if bracket:
        text = b"[" + text + b"]"
    wire = float32_wire([1.0] * count)
    assert (packed_vector(wire, text) is not None) == _fits_before(wire, text)
