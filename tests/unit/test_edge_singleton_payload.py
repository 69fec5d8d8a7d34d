"""qdrant-edge points store a list of one value as the value (`payload_of(singletons=True)`,
session 25: the binding converts a list as a value of its own, ~7 us a point with the GIL
held). Every filter must match such a point exactly as it matches the list, every reader
must take either form, and listed documents are matched by point id (generations created
since then have no `document_id` payload index)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qdrant_edge import (
    EdgeShard,
    Point,
    Query,
    QueryRequest,
    SearchParams,
    UpdateOperation,
)

from contracts.flat_vectors import FlatVectors
from contracts.index import IndexDocument, SearchFilter
from contracts.index_fields import (
    DOCUMENT_ID,
    FACETS,
    HIDDEN_FACET,
    RING_PATH,
    VISIBILITY,
    hidden_term,
)
from contracts.vector_payload import (
    PAYLOAD_INDEXES,
    VECTOR_NAME,
    listed,
    payload_of,
    point_id,
)
from projector.adapters.qdrant_edge_vectors import (
    _PAYLOAD_INDEXES,
    QdrantEdgeTuning,
    _index_params,
)
from query.adapters.qdrant_edge_vectors import edge_filter

DIMENSION = 4
LABELS = ("family", "public", "team")
RINGS = ("", "a", "a/b", "a/b/c", "z")
FACET_VALUES = ("x", "y")
BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def _document(
    index: int, ring: str, labels: tuple[str, ...], facets: dict[str, tuple[str, ...]]
) -> IndexDocument:
    angle = index * 0.37
    return IndexDocument(
        document_id=f"doc-{index}",
        revision=1 + index % 3,
        item_id=f"item-{index}",
        galaxy="g",
        ring=ring,
        status="active" if index % 2 else "draft",
        updated_at=BASE_TIME + timedelta(seconds=index),
        visibility=labels,
        facets=facets,
        vector=(float(np.cos(angle)), float(np.sin(angle)), 0.5, 1.0 + index % 5),
    )


documents = st.builds(
    lambda ring, labels, colours, hidden: (
        ring,
        tuple(labels),
        {
            **({"colour": tuple(colours)} if colours else {}),
            **({HIDDEN_FACET: ("vector",)} if hidden else {}),
        },
    ),
    st.sampled_from(RINGS),
    st.lists(st.sampled_from(LABELS), max_size=3, unique=True),
    st.lists(st.sampled_from(FACET_VALUES), max_size=2, unique=True),
    st.booleans(),
)


@given(st.lists(documents, min_size=1, max_size=12))
def test_singletons_are_the_lists_values_and_read_back_as_the_lists(
    shapes: list[tuple[str, tuple[str, ...], dict[str, tuple[str, ...]]]],
) -> None:
    for index, (ring, labels, facets) in enumerate(shapes):
        document = _document(index, ring, labels, facets)
        lists = payload_of(document)
        packed = payload_of(document, singletons=True)
        assert packed.keys() == lists.keys()
        for field, value in lists.items():
            if isinstance(value, list):
                assert listed(packed[field]) == value, field
                assert isinstance(packed[field], list) is (len(value) > 1), field
            else:
                assert packed[field] == value, field
    assert listed(None) == []


def _shard(path: Path, indexes: dict[str, object]) -> EdgeShard:
    shard = EdgeShard.create(str(path), QdrantEdgeTuning().edge_config(DIMENSION))
    for name, schema in indexes.items():
        shard.update(UpdateOperation.create_field_index(name, schema))  # type: ignore[arg-type]
    return shard


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EdgeShard, EdgeShard]]:
    """The same corpus twice: as lists with every payload index before session 25
    (`document_id` included), and as this adapter writes it now."""
    root = tmp_path_factory.mktemp("edge-singletons")
    corpus = [
        _document(index, ring, labels, facets)
        for index, (ring, labels, facets) in enumerate(
            (ring, labels, facets)
            for ring in RINGS
            for labels in ((), ("family",), ("public",), ("family", "team"))
            for facets in (
                {},
                {"colour": ("x",)},
                {"colour": ("x", "y")},
                {HIDDEN_FACET: ("vector",)},
                {"colour": ("y",), HIDDEN_FACET: ("vector",)},
            )
        )
    ]
    before = {
        field: _index_params(field, kind)
        for field, kind in PAYLOAD_INDEXES.items()
        if field != "revision"
    }
    old = _shard(root / "lists", before)
    new = _shard(root / "singletons", _PAYLOAD_INDEXES)
    for shard, singletons in ((old, False), (new, True)):
        points = [
            Point(
                point_id(d.document_id),
                {VECTOR_NAME: list(d.vector or ())},
                payload_of(d, singletons=singletons),
            )
            for d in corpus
        ]
        shard.update(UpdateOperation.upsert_points(points))
    try:
        yield old, new
    finally:
        old.close()
        new.close()


def _ids(shard: EdgeShard, filter: SearchFilter) -> set[str]:
    points = shard.query(
        QueryRequest(
            limit=1_000,
            query=Query.Nearest([1.0, 0.0, 0.0, 0.0], using=VECTOR_NAME),
            filter=edge_filter(filter),
            with_payload=True,
            with_vector=False,
            params=SearchParams(exact=True),
        )
    )
    return {str((p.payload or {})[DOCUMENT_ID]) for p in points}


filters = st.builds(
    SearchFilter,
    visibility=st.none() | st.lists(st.sampled_from(LABELS), max_size=2, unique=True).map(tuple),
    facets=st.dictionaries(
        st.just("colour"),
        st.lists(st.sampled_from(FACET_VALUES), min_size=1, max_size=2, unique=True).map(tuple),
    ),
    ring_trees=st.none()
    | st.lists(st.sampled_from(RINGS[1:]), min_size=1, max_size=2, unique=True).map(tuple),
    rings=st.none()
    | st.lists(st.sampled_from(RINGS[1:]), min_size=1, max_size=2, unique=True).map(tuple),
    document_ids=st.none()
    | st.lists(
        st.sampled_from([f"doc-{i}" for i in range(0, 100, 7)]), max_size=5, unique=True
    ).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(filters)
def test_every_filter_matches_singletons_as_it_matches_lists(
    shards: tuple[EdgeShard, EdgeShard], filter: SearchFilter
) -> None:
    old, new = shards
    if filter.matches_nothing():
        return
    assert _ids(new, filter) == _ids(old, filter)


def test_the_corpus_holds_singletons_and_the_hidden_term_alone(
    shards: tuple[EdgeShard, EdgeShard],
) -> None:
    _, new = shards
    records = new.retrieve(
        [point_id(f"doc-{i}") for i in range(100)], with_payload=True, with_vector=False
    )
    payloads = [r.payload or {} for r in records]
    assert any(isinstance(p.get(VISIBILITY), str) for p in payloads)
    assert any(isinstance(p.get(RING_PATH), str) for p in payloads)
    assert any(p.get(FACETS) == hidden_term("vector") for p in payloads)
    assert DOCUMENT_ID not in new.info().payload_schema
    # A hidden point is never found, whichever form its facets take.
    everything = _ids(new, SearchFilter())
    hidden = {
        str(p[DOCUMENT_ID]) for p in payloads if hidden_term("vector") in listed(p.get(FACETS))
    }
    assert hidden and not hidden & everything


def test_a_flat_copy_hides_a_point_whose_only_facet_is_the_hidden_term() -> None:
    flat = FlatVectors(DIMENSION, capacity=4)
    hidden = payload_of(_document(1, "", (), {HIDDEN_FACET: ("vector",)}), singletons=True)
    assert hidden[FACETS] == hidden_term("vector")
    # A single term that merely contains the hidden term is not hidden (a substring test
    # of a string would take it for hidden).
    near = payload_of(_document(2, "", (), {"note": (hidden_term("vector"),)}), singletons=True)
    assert isinstance(near[FACETS], str) and hidden_term("vector") in near[FACETS]
    plain = payload_of(_document(3, "", ("family",), {"colour": ("x",)}), singletons=True)
    flat.put(
        [(hidden, [1.0, 0.0, 0.0, 0.0]), (near, [0.0, 1.0, 0.0, 0.0]), (plain, [0, 0, 1.0, 0])]
    )
    found = flat.search([1.0, 1.0, 1.0, 0.0], SearchFilter(), 10)
    assert found is not None
    assert {c.document_id for c in found} == {"doc-2", "doc-3"}
