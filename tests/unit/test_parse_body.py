"""`ingest.service.parse_body` (the typed one-pass parse of `POST /v1/records`) answers
exactly as `parse_batch(loads_strict(raw))`: the same records, or the same error."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.errors import OrreryError
from contracts.records import Record, derive_document_id
from contracts.wire import loads_strict, typed_parse_pairs
from ingest import service
from ingest.service import parse_batch, parse_body

DIMENSION = 4
LIMITS: dict[str, Any] = {
    "max_batch": 5,
    "vector_dimension": DIMENSION,
    "max_record_bytes": 2_000,
    "allowed_namespace": None,
}


@dataclass(frozen=True)
class Obj:
    """A JSON object as written: its pairs in order, a key possibly twice."""

    pairs: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Raw:
    """JSON text written as is (`NaN`, a long integer)."""

    text: str


def encode(value: Any) -> str:
    if isinstance(value, Obj):
        return "{" + ",".join(f"{json.dumps(k)}:{encode(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, list):
        return "[" + ",".join(encode(v) for v in value) + "]"
    return json.dumps(value)


@st.composite
def objects(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> Obj:
    """Some of `fields` (each drawn), sometimes one key twice or an unknown one."""
    pairs = [(k, draw(s)) for k, s in fields.items() if draw(st.booleans()) or k in REQUIRED]
    if pairs and draw(st.integers(0, 7)) == 0:
        key, _ = draw(st.sampled_from(pairs))
        pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(fields[key])))
    if draw(st.integers(0, 15)) == 0:
        pairs.append(("unknown", 1))
    return Obj(tuple(pairs))


REQUIRED = {"namespace", "snapshot_kind", "item_id", "revision"}
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from("abcd"), inner, max_size=3).map(
            lambda d: Obj(tuple(d.items()))
        ),
    ),
    max_leaves=12,
)
odd_numbers = st.sampled_from([Raw("NaN"), Raw("-Infinity"), Raw("1" * 25), Raw("1e400")])
vectors = st.one_of(
    st.none(),
    st.lists(st.floats(-2, 2, allow_nan=False), min_size=DIMENSION, max_size=DIMENSION),
    st.just([0.0] * DIMENSION),
    st.lists(st.floats(-2, 2, allow_nan=False), min_size=1, max_size=3),
    st.lists(st.one_of(st.floats(-2, 2), odd_numbers), min_size=DIMENSION, max_size=DIMENSION),
)
texts = objects(
    {
        "title": st.one_of(st.text(max_size=10), st.integers()),
        "body": st.text(max_size=20),
        "tags": st.lists(st.text(max_size=5), max_size=3),
    }
)
metadata = objects(
    {
        "status": st.sampled_from(["active", "done", 3]),
        "updated_at": st.sampled_from(
            ["2025-01-02T03:04:05Z", "2025-01-02T03:04:05", "1600-01-01T00:00:00Z", 5]
        ),
        "visibility": st.lists(st.sampled_from(["a", "b", "x" * 9_000]), max_size=2),
        "room": st.one_of(scalars, st.lists(st.text(max_size=3), max_size=2), json_values),
        "bad name!": st.just("x"),
    }
)


@st.composite
def records(draw: st.DrawFn) -> Obj:
    namespace = draw(st.sampled_from(["bench", "other", "Bad NS!"]))
    kind = draw(st.sampled_from(["objects", "kind"]))
    item_id = draw(st.sampled_from(["a", "b", "c\n"]))
    fields: dict[str, st.SearchStrategy[Any]] = {
        "namespace": st.just(namespace),
        "snapshot_kind": st.just(kind),
        "item_id": st.just(item_id),
        "revision": st.one_of(st.sampled_from([1, 2, 2.0, 0, True, "2", 2**62 + 1]), odd_numbers),
        "document_id": st.sampled_from(
            [None, derive_document_id(namespace, kind, item_id), "not-the-id"]
        ),
        "galaxy": st.sampled_from(["default", "g1", ""]),
        "payload": st.one_of(
            st.dictionaries(st.sampled_from("pqrs"), json_values, max_size=3).map(
                lambda d: Obj(tuple(d.items()))
            ),
            st.just(Obj((("big", "y" * 3_000),))),
            st.just([1]),
        ),
        "text": texts,
        "metadata": metadata,
        "vector": vectors,
        "index_lanes": st.sampled_from([None, ["lexical"], ["nope"]]),
        "deleted": st.sampled_from([False, True, 0]),
    }
    return draw(objects(fields))


bodies = st.one_of(
    st.lists(records(), max_size=7),
    st.lists(records(), max_size=3).map(lambda rs: Obj((("records", rs),))),
    st.lists(records(), max_size=2).map(lambda rs: Obj((("records", rs), ("x", 1)))),
    records(),
).map(lambda body: encode(body).encode("utf-8"))


def outcome(parse: Any, raw: bytes, namespace: str | None) -> Any:
    try:
        records = parse(raw, **{**LIMITS, "allowed_namespace": namespace})
    except OrreryError as error:
        return ("error", error.code, error.message, error.details)
    return [_comparable(r) for r in records]


def parse_new(raw: bytes, **limits: Any) -> list[Record]:
    batch = parse_body(raw, **limits)
    assert len(batch.stored_json) == len(batch.records)
    for record, stored in zip(batch.records, batch.stored_json, strict=True):
        # What the store keeps: the door's serialization is the store's own.
        assert stored is None or stored == record.model_dump_json()
    return batch.records


def _comparable(record: Record) -> tuple[Any, ...]:
    # A default `updated_at` is the time of validation: the two parses differ there.
    metadata = record.metadata.model_fields_set
    exclude = None if "updated_at" in metadata else {"metadata": {"updated_at"}}
    return (
        record.model_dump_json(exclude=exclude),
        record.model_fields_set,
        record.text.model_fields_set,
        metadata,
    )


def parse_old(raw: bytes, **limits: Any) -> list[Record]:
    return parse_batch(loads_strict(raw), **limits)


@settings(max_examples=150, deadline=None)
@given(body=bodies, namespace=st.sampled_from([None, "bench"]))
def test_parse_body_answers_as_the_strict_parse(body: bytes, namespace: str | None) -> None:
    assert outcome(parse_new, body, namespace) == outcome(parse_old, body, namespace)


def body_of(*records: dict[str, Any]) -> bytes:
    return json.dumps(list(records)).encode("utf-8")


ORDINARY = {
    "namespace": "bench",
    "snapshot_kind": "objects",
    "item_id": "a",
    "revision": 1,
    "payload": {"a": [{"b": 1}, 2], "c": {}},
    "text": {"title": "t"},
    "metadata": {"status": "active", "updated_at": "2025-01-02T03:04:05Z", "room": "k", "t": [1]},
    "vector": [0.5, 0.5, 0.5, 0.5],
}


def test_an_ordinary_body_takes_the_typed_parse() -> None:
    raw = body_of(ORDINARY, {**ORDINARY, "item_id": "b", "document_id": None})
    pairs = typed_parse_pairs(raw)
    assert pairs is not None
    typed = service._typed_records(raw, pairs)
    assert typed is not None
    assert typed == parse_old(raw, **LIMITS)
    batch = parse_body(raw, **LIMITS)
    assert batch.stored_json == [r.model_dump_json() for r in typed]


def test_a_duplicate_key_leaves_the_typed_parse_to_the_strict_one() -> None:
    raw = body_of(ORDINARY).replace(b'"status": "active"', b'"status": "a", "status": "b"')
    pairs = typed_parse_pairs(raw)
    assert pairs is not None
    assert service._typed_records(raw, pairs) is None
    assert outcome(parse_new, raw, None)[1].value == "invalid_json"


def test_a_derived_id_is_not_marked_as_sent() -> None:
    derived = Record.model_validate(ORDINARY)
    sent_null = Record.model_validate({**ORDINARY, "document_id": None})
    assert "document_id" not in derived.model_fields_set
    assert "document_id" in sent_null.model_fields_set
    assert derived.document_id == sent_null.document_id == derived.doc_id
    assert derived.model_dump_json() == sent_null.model_dump_json()
