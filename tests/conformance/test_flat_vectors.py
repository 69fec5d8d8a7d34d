"""The in-memory copies the embedded query side scans (`contracts.flat_vectors`) answer
what the qdrant-edge shard itself answers, through any sequence of writes.

The conformance suite runs every vector case through them too (`qdrant-edge-flat` in
`test_vector_index.ENGINES`); here a property drives random writes, deletes and filters
against one index and compares the copy's answers with the shard's exact ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.flat_vectors import FlatVectors, flat_capacity
from contracts.index import IndexDocument, SearchFilter
from contracts.index_fields import HIDDEN_FACET, hidden_term
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch
from tests.conformance.corpus import doc

DIM = 6
_T0 = datetime(2026, 1, 1, tzinfo=UTC)
_GALAXIES = ("g1", "g2")
_STATUSES = ("active", "draft", "archived")
_RINGS = ("", "a", "a/b")

vectors = st.lists(st.integers(-3, 3), min_size=DIM, max_size=DIM).filter(any)
documents = st.builds(
    lambda n, rev, galaxy, status, ring, minutes, vector, hidden: doc(
        f"d{n}",
        rev,
        galaxy=galaxy,
        status=status,
        ring=ring,
        updated_at=_T0 + timedelta(minutes=minutes),
        vector=tuple(float(x) for x in vector),
        facets={HIDDEN_FACET: ("vector",)} if hidden else None,
    ),
    st.integers(0, 24),
    st.integers(1, 4),
    st.sampled_from(_GALAXIES),
    st.sampled_from(_STATUSES),
    st.sampled_from(_RINGS),
    st.integers(0, 60),
    vectors,
    st.sampled_from((False, False, False, True)),
)
writes = st.lists(
    st.tuples(
        st.lists(documents, max_size=8),
        st.lists(
            st.tuples(st.integers(0, 24).map(lambda n: f"d{n}"), st.integers(1, 5)), max_size=3
        ),
    ),
    min_size=1,
    max_size=5,
)
filters = st.builds(
    lambda galaxy, status, rings, after, before, ids: SearchFilter(
        galaxy=galaxy,
        status=status,
        rings=rings,
        updated_after=None if after is None else _T0 + timedelta(minutes=after),
        updated_before=None if before is None else _T0 + timedelta(minutes=before),
        document_ids=ids,
    ),
    st.none() | st.sampled_from((*_GALAXIES, "nowhere")),
    st.none() | st.lists(st.sampled_from(_STATUSES), max_size=2).map(tuple),
    st.none() | st.lists(st.sampled_from(("a", "a/b", "zz")), min_size=1, max_size=2).map(tuple),
    st.none() | st.integers(0, 60),
    st.none() | st.integers(0, 60),
    st.none() | st.lists(st.integers(0, 26).map(lambda n: f"d{n}"), max_size=6).map(tuple),
)

_EPS = 1e-6


@pytest.fixture
def index(tmp_path: Path) -> Iterator[QdrantEdgeVectorIndex]:
    vectors_index = QdrantEdgeVectorIndex(tmp_path / "vectors")
    yield vectors_index
    vectors_index.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=writes, asked=st.lists(st.tuples(vectors, filters, st.integers(1, 30)), max_size=6))
def test_the_copy_answers_what_the_shard_answers(
    index: QdrantEdgeVectorIndex,
    batches: list[tuple[list[IndexDocument], list[tuple[str, int]]]],
    asked: list[tuple[list[int], SearchFilter, int]],
) -> None:
    generation = f"flat-{abs(hash((str(batches), str(asked)))):x}"[:40]
    index.create(generation, DIM)
    try:
        engine = QdrantEdgeVectorSearch(index.shard_for)
        flat = QdrantEdgeVectorSearch(index.shard_for, flat_provider=index.flat_for)
        index.apply(generation, *batches[0])
        # Built from the shard after the first write, kept by `apply` after that.
        assert index.flat_for(generation) is not None
        for upserts, deletes in batches[1:]:
            index.apply(generation, upserts, deletes)
        for raw, filter, limit in asked:
            vector = [float(x) for x in raw]
            exact = engine.search(generation, vector, filter, 1000)
            got = flat.search(generation, vector, filter, limit)
            # Filter semantics exactly: asked for all, the same documents.
            assert {c.document_id for c in flat.search(generation, vector, filter, 1000)} == {
                c.document_id for c in exact
            }
            # Best first, ties by id; each score the engine's to rounding; nothing left out
            # scores better than what was kept.
            assert got == sorted(got, key=lambda c: (-c.score, c.document_id))
            assert len(got) == min(limit, len(exact))
            by_id = {c.document_id: c for c in exact}
            for candidate in got:
                reference = by_id[candidate.document_id]
                assert abs(candidate.score - reference.score) <= _EPS
                assert candidate._replace(score=0.0) == reference._replace(score=0.0)
            kept = {c.document_id for c in got}
            if got:
                floor = got[-1].score
                assert all(c.score <= floor + _EPS for c in exact if c.document_id not in kept)
            # Score lookups by id agree too.
            ids = SearchFilter(
                galaxy=filter.galaxy, status=filter.status, document_ids=(*tuple(by_id)[:5], "d99")
            )
            looked_up = flat.scores(generation, vector, ids)
            reference_scores = engine.scores(generation, vector, ids)
            assert looked_up.keys() == reference_scores.keys()
            assert all(abs(looked_up[d] - reference_scores[d]) <= _EPS for d in looked_up)
    finally:
        index.drop(generation)


def test_a_generation_that_outgrows_the_copy_is_searched_in_its_shard(tmp_path: Path) -> None:
    index = QdrantEdgeVectorIndex(tmp_path / "v", flat_max_points=3)
    try:
        index.create("g", DIM)
        index.apply("g", [doc(f"d{n}", vector=(1.0, n, 0, 0, 0, 0)) for n in range(3)], [])
        copy = index.flat_for("g")
        assert copy is not None and len(copy) == 3
        index.apply("g", [doc("d3", vector=(1.0, 3, 0, 0, 0, 0))], [])
        assert index.flat_for("g") is None  # for good, in this process
        search = QdrantEdgeVectorSearch(index.shard_for, flat_provider=index.flat_for)
        found = search.search("g", [1.0, 3, 0, 0, 0, 0], SearchFilter(), 2)
        assert [c.document_id for c in found] == ["d3", "d2"]
    finally:
        index.close()


def test_copies_share_one_byte_budget_and_give_it_back_when_dropped(tmp_path: Path) -> None:
    capacity = flat_capacity(10_000, DIM)
    index = QdrantEdgeVectorIndex(tmp_path / "v", flat_max_bytes=capacity * DIM * 4)
    try:
        for name in ("a", "b"):
            index.create(name, DIM)
            index.apply(name, [doc("d1", vector=(1.0, 0, 0, 0, 0, 0))], [])
        assert index.flat_for("a") is not None
        assert index.flat_for("b") is None  # the budget held one copy
        index.drop("a")
        index.create("c", DIM)
        assert index.flat_for("c") is not None
    finally:
        index.close()


def test_hidden_and_deleted_documents_are_no_rows() -> None:
    flat = FlatVectors(2, capacity=1)
    flat.put(
        [
            (
                {
                    "document_id": "a",
                    "revision": 1,
                    "updated_at": "2026-01-01T00:00:00.000000Z",
                    "status": "active",
                    "galaxy": "g",
                },
                [1.0, 0.0],
            ),
            (
                {
                    "document_id": "b",
                    "revision": 1,
                    "updated_at": "2026-01-01T00:00:00.000000Z",
                    "status": "active",
                    "galaxy": "g",
                    "facets": [hidden_term("vector")],
                },
                [1.0, 0.0],
            ),
            (
                {
                    "document_id": "c",
                    "revision": 2,
                    "updated_at": "2026-01-01T00:00:00.000000Z",
                    "status": "active",
                    "galaxy": "g",
                },
                [0.0, 1.0],
            ),
        ]
    )
    flat.remove(["c"])
    found = flat.search([1.0, 1.0], SearchFilter(), 10)
    assert found is not None and [c.document_id for c in found] == ["a"]
    assert flat.search([1.0, 0.0], SearchFilter(facets={"x": ("y",)}), 10) is None


def _row(document_id: str, status: str = "active") -> dict[str, object]:
    return {
        "document_id": document_id,
        "revision": 1,
        "updated_at": "2026-01-01T00:00:00.000000Z",
        "status": status,
        "galaxy": "g",
    }


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.lists(st.floats(-1, 1, width=32), min_size=8, max_size=8), min_size=1),
    query=st.lists(st.floats(-1, 1, width=32), min_size=8, max_size=8).filter(any),
    replaced=st.lists(st.floats(-1, 1, width=32), min_size=8, max_size=8),
)
def test_a_lookup_after_a_scan_scores_exactly_as_a_fresh_lookup(
    rows: list[list[float]], query: Sequence[float], replaced: list[float]
) -> None:
    """`scores` after a `search` for the same query on the same thread (the re-score's
    lookup): bit for bit what scoring the rows alone gives, and never a score from before
    a write."""
    flat = FlatVectors(8, capacity=4)
    flat.put([(_row(f"d{n}", "active" if n % 3 else "draft"), row) for n, row in enumerate(rows)])
    twin = FlatVectors(8, capacity=4)  # the same rows, never scanned
    twin.put([(_row(f"d{n}", "active" if n % 3 else "draft"), row) for n, row in enumerate(rows)])
    ids = SearchFilter(status=("active",), document_ids=tuple(f"d{n}" for n in range(len(rows))))
    query = tuple(query)  # the query-vector cache's form: one tuple, known by identity
    flat.search(query, SearchFilter(status=("active",)), 3)
    assert flat.scores(query, ids) == twin.scores(query, ids)
    # A write after the scan: the lookup scores the row as written now.
    flat.put([(_row("d1"), replaced)])
    twin.put([(_row("d1"), replaced)])
    assert flat.scores(query, ids) == twin.scores(query, ids)


def _exact_scan(
    flat: FlatVectors, vector: Sequence[float], ids: Sequence[str], limit: int
) -> list[tuple[str, float]]:
    """The answer of scoring every listed row exactly (`scores`: the `einsum` of each row
    alone), best first, ties by id: what `search` returned before its shortlist."""
    scored = flat.scores(vector, SearchFilter(document_ids=tuple(ids))) or {}
    return sorted(scored.items(), key=lambda item: (-item[1], item[0]))[:limit]


@settings(max_examples=60, deadline=None)
@given(
    dimension=st.sampled_from((3, 16, 384)),
    count=st.integers(1, 400),
    limit=st.integers(1, 40),
    duplicates=st.integers(0, 30),
    scale=st.sampled_from((1.0, 1.0, 1e-3, 1e3)),
    drafts=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_shortlisted_search_answers_what_the_exact_scan_answers(
    dimension: int,
    count: int,
    limit: int,
    duplicates: int,
    scale: float,
    drafts: bool,
    seed: int,
) -> None:
    """`search` scores exactly only the rows an approximate pass cannot rule out
    (`FlatVectors._shortlist`): the same documents, order and scores, bit for bit, as
    scoring every row exactly, with exact ties (duplicated rows, ties across the `limit`
    boundary), rows of any norm, near-identical rows and filters that keep a few rows."""
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((count, dimension)).astype(np.float32)
    near = rng.integers(0, count, size=min(count, 20))
    # Rows within float32 rounding of each other: their two scores differ by an ulp or so.
    matrix[near] = matrix[near[0]] + rng.standard_normal((near.size, dimension)).astype(
        np.float32
    ) * np.float32(1e-6)
    matrix *= np.float32(scale)
    rows = [matrix[n].tolist() for n in range(count)]
    rows += [rows[int(n)] for n in rng.integers(0, count, size=duplicates)]  # exact ties
    flat = FlatVectors(dimension, capacity=8)
    flat.put(
        [
            (_row(f"d{n:04d}", "draft" if drafts and n % 5 else "active"), row)
            for n, row in enumerate(rows)
        ]
    )
    kept = [f"d{n:04d}" for n in range(len(rows)) if not (drafts and n % 5)]
    for vector in (tuple(rng.standard_normal(dimension).tolist()), tuple(rows[0])):
        if not any(vector):
            continue
        got = flat.search(vector, SearchFilter(status=("active",)), limit)
        assert got is not None
        assert [(c.document_id, c.score) for c in got] == _exact_scan(flat, vector, kept, limit)


def test_a_shortlist_scores_only_the_rows_that_can_be_kept() -> None:
    """Over many rows, the exact `einsum` runs on the shortlist alone (not every row)."""
    rng = np.random.default_rng(7)
    flat = FlatVectors(32, capacity=8)
    matrix = rng.standard_normal((2_000, 32))
    matrix = (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)
    flat.put([(_row(f"d{n}"), row.tolist()) for n, row in enumerate(matrix)])
    shapes: list[tuple[int, ...]] = []
    real = np.einsum

    def einsum(subscripts: str, *operands: np.ndarray) -> np.ndarray:
        shapes.append(operands[0].shape)
        return real(subscripts, *operands)

    with mock.patch.object(np, "einsum", einsum):
        found = flat.search(tuple(matrix[3].tolist()), SearchFilter(), 10)
    assert found is not None and found[0].document_id == "d3" and len(found) == 10
    assert len(shapes) == 1 and 10 <= shapes[0][0] < 40
