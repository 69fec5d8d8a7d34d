"""ChonkyDB dialect rules that need no server: index names, metadata kept verbatim."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.chonkydb import (
    KEPT_METADATA,
    MAX_KEPT_METADATA_BYTES,
    IndexLanes,
    client_metadata,
    index_lanes,
    split_metadata,
)
from contracts.records import RecordMetadata


@pytest.mark.parametrize(
    ("name", "lanes"),
    [
        ("fulltext", {"lexical"}),
        ("fulltext_index", {"lexical"}),
        ("ccodex_memory_fulltext", {"lexical"}),
        ("bm25", {"lexical"}),
        ("lexical", {"lexical"}),
        ("tags", {"lexical"}),
        ("vector", {"vector"}),
        ("hnsw", {"vector"}),
        ("ccodex_memory_vector_768", {"vector"}),
        ("temporal", {"filter"}),
        ("temporal_index", {"filter"}),
        ("metadata", {"filter"}),
        ("graph_index", set()),
        ("Fulltext", {"lexical"}),
    ],
)
def test_chonkydb_index_names_map_to_lanes(name: str, lanes: set[str]) -> None:
    assert index_lanes(name) == frozenset(lanes)


def test_unknown_index_names_are_ignored_and_listed() -> None:
    assert index_lanes("sparkle") is None
    twinr = IndexLanes.of(["fulltext", "temporal", "tags"])
    assert twinr.search == {"lexical"} and twinr.filter and twinr.ignored == ()
    odd = IndexLanes.of(["sparkle", "graph", "hnsw"])
    assert odd.search == {"vector"} and odd.ignored == ("sparkle", "graph")
    assert IndexLanes.of([]).search == frozenset()


def test_metadata_orrery_cannot_read_is_kept_verbatim() -> None:
    # Twinr's conflict records: `updated_at` holds text, not a time.
    written = {
        "status": "active",
        "updated_at": "superseded by conflict:keys",
        "visibility": ["household"],
        "twinr_memory_item_id": "conflict:keys",
        "options": [{"id": "a"}, {"id": "b"}],
        "not a name": 1,
        "empty": None,
    }
    stored = split_metadata(written)
    RecordMetadata.model_validate(stored)  # what Orrery stores is valid metadata
    assert stored["status"] == "active" and stored["visibility"] == ["household"]
    assert "updated_at" not in stored
    assert json.loads(stored[KEPT_METADATA]) == {
        "updated_at": "superseded by conflict:keys",
        "options": [{"id": "a"}, {"id": "b"}],
        "not a name": 1,
        "empty": None,
    }
    assert client_metadata(stored) == written


def test_a_parsing_updated_at_is_orrerys() -> None:
    stored = split_metadata({"updated_at": "2026-03-19T12:00:00Z"})
    assert stored == {"updated_at": "2026-03-19T12:00:00Z"}
    assert RecordMetadata.model_validate(stored).updated_at.year == 2026


def test_kept_metadata_is_bounded() -> None:
    with pytest.raises(ValueError, match="bytes as JSON"):
        split_metadata({"blob": {"x": "y" * MAX_KEPT_METADATA_BYTES}})


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.text(min_size=1, max_size=12), _JSON, max_size=6))
def test_every_metadata_is_accepted_and_comes_back(written: dict[str, Any]) -> None:
    stored = split_metadata(written)
    RecordMetadata.model_validate(stored)
    back = client_metadata(stored)
    assert set(back) == set(written)
    for key, value in written.items():
        if key not in ("updated_at",):  # a parsing time is Orrery's (normalized)
            assert back[key] == value
