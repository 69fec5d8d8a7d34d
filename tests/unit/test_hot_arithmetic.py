"""Re-arranged hot-path computations give what the plain ones gave: the flat BM25 pass
started from its first dense term instead of zeros (`FlatLexical._scores`), the memo's
cosines multiplied in place and clamped by numpy (`QdrantEdgeVectorSearch.scores`), and
the flat copies' any-of filter masks by equality passes (`contracts.flat_vectors.any_of`)
instead of `numpy.isin`."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.flat_lexical import FlatLexical, LexicalRow
from contracts.flat_vectors import any_of
from contracts.index import Candidate, SearchFilter
from query.adapters.qdrant_edge_vectors import _unit

_WORDS = ("a", "b", "c", "d", "e")
_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _row(number: int, title: list[str], body: list[str], hidden: bool) -> LexicalRow:
    return LexicalRow(
        candidate=Candidate(f"doc-{number:04d}", 1, 0.0, _T0, "active"),
        galaxy="g",
        ring="",
        hidden=hidden,
        tokens={"title": title, "body": body},
    )


_DOCS = st.lists(
    st.tuples(
        st.lists(st.sampled_from(_WORDS), max_size=4),
        st.lists(st.sampled_from(_WORDS), max_size=8),
        st.booleans(),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(
    _DOCS,
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=4, unique=True),
    st.fixed_dictionaries({"title": st.sampled_from([0.5, 1.0, 2.0]), "body": st.just(1.0)}),
)
def test_the_flat_pass_sums_as_from_zeros(
    docs: list[tuple[list[str], list[str], bool]], terms: list[str], boosts: dict[str, float]
) -> None:
    flat = FlatLexical(["title", "body"], max_rows=1_000)
    assert flat.add(_row(i, t, b, h) for i, (t, b, h) in enumerate(docs))
    expected = np.zeros(len(docs), dtype=np.float32)
    for term in terms:
        for name, boost in boosts.items():
            field = flat._fields[name]
            posting = field.postings.get(term)
            if posting is None:
                continue
            rows, contribution = flat._contribution(name, term, posting, field, boost)
            if rows is None:
                expected += contribution
            else:
                expected[rows] += contribution
    got = flat._scores(terms, boosts)
    assert got.tobytes() == expected.tobytes()
    # The visible-rows mask is the one array while no clause narrows, and is kept apart
    # from masks that narrow (a narrowing never changes it).
    visible = flat._mask(SearchFilter(), with_ids=False)
    assert visible is not None and visible.tolist() == [not h for _t, _b, h in docs]
    narrowed = flat._mask(SearchFilter(document_ids=("doc-0000",)), with_ids=True)
    assert narrowed is not None and narrowed.sum() <= 1
    assert flat._mask(SearchFilter(), with_ids=False) is visible
    assert visible.tolist() == [not h for _t, _b, h in docs]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(2, 64), st.integers(0, 2**32 - 1))
def test_the_memo_cosines_are_the_plain_ones(count: int, dimension: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    stored = rng.standard_normal((count, dimension)).astype(np.float32)
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    query_vector = [float(x) for x in rng.standard_normal(dimension)]
    query = _unit(query_vector)
    assert _unit(query_vector) is query  # the same list: scaled once
    rows = stored.astype(np.float64)
    plain = [min(1.0, max(-1.0, c)) for c in (rows * query).sum(axis=1).tolist()]
    np.multiply(rows, query, out=rows)
    assert np.clip(rows.sum(axis=1), -1.0, 1.0).tolist() == plain


@given(
    st.lists(st.integers(-1, 12), max_size=200),
    st.lists(st.integers(-1, 12), max_size=12),
    st.sampled_from([np.int32, np.int64]),
)
def test_the_any_of_mask_is_isin(column: list[int], codes: list[int], dtype: type) -> None:
    values = np.asarray(column, dtype=dtype)
    got = any_of(values, codes)
    assert got.dtype == np.bool_
    assert np.array_equal(got, np.isin(values, codes))
