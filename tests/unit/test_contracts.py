from __future__ import annotations

import hashlib
import json
import random
import uuid
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts import digests
from contracts.auth import authenticate, parse_api_keys
from contracts.digests import canonical_json, id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.records import (
    DOCUMENT_ID_NAMESPACE,
    Record,
    derive_document_id,
    identity_violation,
    payload_sha256,
)
from contracts.topk import TopKRequest


def test_canonical_json_sorts_keys_and_keeps_unicode() -> None:
    assert canonical_json({"b": 1, "a": "ä"}) == '{"a":"ä","b":1}'.encode()


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_canonical_json_is_json_dumps_canonical(value: Any) -> None:
    expected = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
    assert canonical_json(value) == expected


def test_canonical_json_refuses_non_finite_numbers() -> None:
    for value in (float("nan"), [1.0, float("inf")], {"a": -float("inf")}):
        with pytest.raises(ValueError):
            canonical_json(value)


def _reference_id_set_digest(pairs: list[tuple[str, int]]) -> str:
    """`id_set_digest` as first written: one canonical JSON line per sorted pair."""
    digest = hashlib.sha256()
    for document_id, revision in sorted(pairs):
        digest.update(canonical_json([document_id, revision]))
        digest.update(b"\n")
    return digest.hexdigest()


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=40), st.integers(), max_size=30))
def test_id_set_digest_is_the_canonical_json_of_each_pair(pairs: dict[str, int]) -> None:
    items = list(pairs.items())
    assert id_set_digest(items) == _reference_id_set_digest(items)
    # Values of other types than str and int take canonical_json itself.
    odd_ids = ('\u00e4"\n\x00', "z")
    odd = [*[p for p in items if p[0] not in odd_ids], (odd_ids[0], True), (odd_ids[1], 10**30)]
    assert id_set_digest(odd) == _reference_id_set_digest(odd)


def test_id_set_digest_ignores_order_and_rejects_duplicates() -> None:
    pairs = [("b", 2), ("a", 1)]
    assert id_set_digest(pairs) == id_set_digest(reversed(pairs))
    assert id_set_digest(pairs) != id_set_digest([("a", 1), ("b", 3)])
    assert id_set_digest([]) != id_set_digest([("a", 1)])
    with pytest.raises(ValueError, match="twice"):
        id_set_digest([("a", 1), ("a", 2)])


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=6), st.integers(0, 3), max_size=40),
    st.sampled_from(["ascending", "descending", "shuffled"]),
    st.randoms(use_true_random=False),
)
def test_id_set_digest_hashes_ascending_pairs_chunk_by_chunk(
    pairs: dict[str, int], order: str, rng: random.Random
) -> None:
    """Ids in strictly ascending order (a registry read in key order) are hashed as they
    come, a chunk between two `pace` calls; any other order is sorted first. The digest
    is the reference one either way, also when the order breaks after a few chunks."""
    items = sorted(pairs.items(), reverse=order == "descending")
    if order == "shuffled":
        rng.shuffle(items)
    paced: list[int] = []
    with mock.patch.object(digests, "_DIGEST_CHUNK", 3):
        got = id_set_digest(iter(items), pace=lambda: paced.append(1))
        # A collection is read again for the sort instead of kept chunk by chunk.
        assert id_set_digest(items) == id_set_digest(dict(items).items()) == got
    assert got == _reference_id_set_digest(items)
    # One pace per chunk hashed: every chunk of an ascending set, at least one otherwise.
    chunks = -(-len(items) // 3)
    assert len(paced) >= min(chunks, 1) and len(paced) <= 2 * chunks


def test_id_set_digest_rejects_duplicates_across_chunks() -> None:
    with mock.patch.object(digests, "_DIGEST_CHUNK", 2):
        with pytest.raises(ValueError, match="twice"):
            id_set_digest([("a", 1), ("b", 1), ("b", 1), ("c", 1)])
        with pytest.raises(ValueError, match="twice"):
            id_set_digest([("a", 1), ("b", 1), ("b", 2)])


def test_document_id_is_stable_and_scoped() -> None:
    one = derive_document_id("ns", "objects", "fact:1")
    assert one == derive_document_id("ns", "objects", "fact:1")
    assert one != derive_document_id("ns", "conflicts", "fact:1")
    record = Record(namespace="ns", snapshot_kind="objects", item_id="fact:1", revision=1)
    assert record.document_id == one


def test_document_id_is_the_uuid5_of_the_identity() -> None:
    # The ids every index is keyed by: the fast derivation must equal uuid5 exactly.
    for namespace, kind, item, galaxy in [
        ("ns", "objects", "fact:1", "default"),
        ("ns", "objects", "fact:1", "g1"),
        ("näme", "archive", "ünïcode 💫 id", "default"),
        ("a" * 128, "b" * 128, "c" * 512, "d" * 128),
    ]:
        parts = [namespace, kind, item] + ([] if galaxy == "default" else [galaxy])
        expected = str(uuid.uuid5(DOCUMENT_ID_NAMESPACE, "\x1f".join(parts)))
        assert derive_document_id(namespace, kind, item, galaxy) == expected


def test_document_id_is_scoped_by_namespace_and_galaxy() -> None:
    base = derive_document_id("ns", "objects", "x")
    assert derive_document_id("ns", "objects", "x", "default") == base
    assert derive_document_id("other", "objects", "x") != base
    assert derive_document_id("ns", "objects", "x", "g1") != base
    assert derive_document_id("ns", "objects", "x", "g1") != derive_document_id(
        "ns", "objects", "x", "g2"
    )
    record = Record(namespace="ns", snapshot_kind="objects", item_id="x", revision=1, galaxy="g1")
    assert record.doc_id == derive_document_id("ns", "objects", "x", "g1")


def test_an_explicit_document_id_must_be_the_derived_one() -> None:
    """The model keeps what it is given (stored rows, events); the API refuses ids that
    are not the record's own (`identity_violation`), so no write names a foreign id."""
    foreign = Record(
        namespace="ns", snapshot_kind="objects", item_id="x", revision=1, document_id="doc-123"
    )
    assert foreign.doc_id == "doc-123"
    assert identity_violation(foreign) is not None
    own = Record(
        namespace="ns",
        snapshot_kind="objects",
        item_id="x",
        revision=1,
        document_id=derive_document_id("ns", "objects", "x"),
    )
    assert identity_violation(own) is None
    other_galaxy = Record(
        namespace="ns",
        snapshot_kind="objects",
        item_id="x",
        revision=1,
        galaxy="g1",
        document_id=derive_document_id("ns", "objects", "x", "g2"),
    )
    assert identity_violation(other_galaxy) is not None


@pytest.mark.parametrize(
    "change",
    [
        {"revision": 0},
        {"namespace": "bad/namespace"},
        {"namespace": " padded"},
        {"ring": "a//b"},
        {"metadata": {"updated_at": "2026-03-19T12:00:00"}},
        {"metadata": {"room": {"nested": 1}}},
        {"unknown": 1},
    ],
)
def test_record_rejects_bad_input(change: dict[str, object]) -> None:
    raw = {"namespace": "ns", "snapshot_kind": "objects", "item_id": "x", "revision": 1}
    with pytest.raises(ValidationError):
        Record.model_validate({**raw, **change})


def test_facets_are_strings() -> None:
    record = Record.model_validate(
        {
            "namespace": "ns",
            "snapshot_kind": "objects",
            "item_id": "x",
            "revision": 1,
            "metadata": {"room": "hall", "floor": 1, "tags": ["a", True]},
        }
    )
    assert record.metadata.facets() == {"floor": ["1"], "room": ["hall"], "tags": ["a", "true"]}


def test_payload_sha256_is_over_canonical_json() -> None:
    assert payload_sha256({"b": 1, "a": 2}) == payload_sha256({"a": 2, "b": 1})


def test_topk_request_rejects_unknown_fields_at_every_level() -> None:
    base = {"namespace": "ns", "scope_ref": "longterm:objects:current", "query_text": "x"}
    TopKRequest.model_validate(base)
    for bad in (
        {"surprise": 1},
        {"ranking": {"boost": 1}},
        {"include": {"all": True}},
        {"filters": {"colour": ["red"]}},
    ):
        with pytest.raises(ValidationError) as info:
            TopKRequest.model_validate({**base, **bad})
        assert info.value.errors()[0]["type"] == "extra_forbidden"


def test_api_keys_parse_and_authenticate() -> None:
    grants = parse_api_keys("k1=twinr-prod, k2=demo/anna")
    assert grants["k2"].galaxy == "anna"
    assert authenticate(grants, "k1", None).namespace == "twinr-prod"  # type: ignore[union-attr]
    assert authenticate(grants, None, "Bearer k2").galaxy == "anna"  # type: ignore[union-attr]
    assert authenticate({}, None, None) is None
    for key, auth in ((None, None), ("nope", None), (None, "Basic k1")):
        with pytest.raises(OrreryError) as info:
            authenticate(grants, key, auth)
        assert info.value.code is ErrorCode.UNAUTHORIZED
    with pytest.raises(ValueError):
        parse_api_keys("no-equals-sign")


def test_record_changed_json_is_the_events_own_json() -> None:
    from contracts.events import RecordChanged, record_changed_json

    record = Record(
        namespace="ns",
        snapshot_kind="objects",
        item_id="a\u00e9\U0001f600",
        revision=3,
        payload={"z": [1, 2.5, None], "a": {"b": '\\"'}},
        text={"title": "t", "tags": ["x"]},
        metadata={"status": "active", "updated_at": "2026-01-01T00:00:00Z", "room": "hall"},
        vector=[0.1, -0.25, 1e-7],
        deleted=False,
    )
    produced = record_changed_json(record.model_dump_json())
    assert produced == RecordChanged(record=record).model_dump_json()
    assert RecordChanged.model_validate_json(produced) == RecordChanged(record=record)
