"""The qdrant-edge adapter's memoized point keys are exactly `str(point_id(document_id))`
and `point_id(document_id).int`; so is `point_key` (the Qdrant server adapter's key)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.vector_payload import POINT_ID_NAMESPACE, point_id, point_key
from query.adapters.qdrant_edge_vectors import _key, _point_key, _point_number

_IDS = st.one_of(
    st.text(min_size=1, max_size=64),
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
)


@given(_IDS)
def test_the_key_is_the_point_id_as_a_string(document_id: str) -> None:
    assert _point_key(document_id) == str(point_id(document_id))


@given(st.one_of(_IDS, st.text(max_size=64), st.uuids().map(lambda u: "{" + str(u) + "}")))
def test_point_key_is_the_point_id_as_a_string(document_id: str) -> None:
    assert point_key(document_id) == str(point_id(document_id))


def test_point_key_refuses_what_point_id_refuses() -> None:
    # A lone surrogate has no UTF-8: uuid5 raises, and so does `point_key`.
    with pytest.raises(UnicodeEncodeError):
        point_id("doc-\ud800")
    with pytest.raises(UnicodeEncodeError):
        point_key("doc-\ud800")


@given(_IDS)
def test_the_number_is_the_point_id_as_the_engine_returns_it(document_id: str) -> None:
    # The engine hands a point's id back as a `uuid.UUID`; `_key` reads its number.
    assert _point_number(document_id) == _key(point_id(document_id)) == point_id(document_id).int


@given(st.lists(_IDS, min_size=1, max_size=20))
def test_asking_twice_answers_the_same(document_ids: list[str]) -> None:
    first = [_point_key(d) for d in document_ids]
    assert [_point_key(d) for d in document_ids] == first


def test_a_canonical_uuid_is_its_own_key_and_others_are_hashed() -> None:
    canonical = str(uuid.UUID(int=0xABCDEF))
    assert _point_key(canonical) == canonical
    assert _point_key("doc-1") == str(uuid.uuid5(POINT_ID_NAMESPACE, "doc-1"))
    assert _point_key(canonical.upper()) == str(uuid.uuid5(POINT_ID_NAMESPACE, canonical.upper()))
