"""`FlatLexical.search` scoring a query's rare terms at their rows alone (`_pruned`) and
`FlatLexical.scores` summing listed rows alone (`_scores_at`) answer what the pass over
every row answers, bit for bit: the same candidates, the same float32 scores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contracts.flat_lexical as flat_lexical
from contracts.flat_lexical import FlatLexical, LexicalRow
from contracts.index import Candidate, SearchFilter

# Zipf-like: the first words are in most rows (dense-kept), the last in few (sparse-kept).
_WORDS = ("a", "b", "c", "d", "e", "f", "g", "h")
_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _row(number: int, title: list[str], body: list[str], hidden: bool, galaxy: str) -> LexicalRow:
    return LexicalRow(
        candidate=Candidate(
            f"doc-{number:04d}", 1, 0.0, _T0 + timedelta(days=number % 7), "active"
        ),
        galaxy=galaxy,
        ring="",
        hidden=hidden,
        tokens={"title": title, "body": body},
    )


_WORD = st.integers(0, 1_000).map(lambda n: _WORDS[min(int(n**0.5) // 4, len(_WORDS) - 1)])
_DOCS = st.lists(
    st.tuples(
        st.lists(_WORD, max_size=4),
        st.lists(_WORD, max_size=10),
        st.booleans(),
        st.sampled_from(["g", "h"]),
    ),
    min_size=20,
    max_size=120,
)
_FILTERS = st.sampled_from(
    [
        SearchFilter(),
        SearchFilter(galaxy="g"),
        SearchFilter(updated_after=_T0 + timedelta(days=3)),
    ]
)


@pytest.fixture(autouse=True)
def _prune_always(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small copies: try the rare rows at any share, and keep a term dense from a quarter.
    monkeypatch.setattr(flat_lexical, "_PRUNED_SHARE", 1.0)
    monkeypatch.setattr(flat_lexical, "_DENSE_SHARE", 0.25)


def _copy(docs: list[tuple[list[str], list[str], bool, str]]) -> FlatLexical:
    flat = FlatLexical(["title", "body"], max_rows=1_000)
    assert flat.add(_row(i, t, b, h, g) for i, (t, b, h, g) in enumerate(docs))
    return flat


@settings(max_examples=60, deadline=None)
@given(
    _DOCS,
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=5, unique=True),
    st.fixed_dictionaries({"title": st.sampled_from([0.5, 1.0, 2.0]), "body": st.just(1.0)}),
    _FILTERS,
    st.integers(1, 6),
)
def test_the_rare_rows_answer_as_the_pass(
    docs: list[tuple[list[str], list[str], bool, str]],
    terms: list[str],
    boosts: dict[str, float],
    filter: SearchFilter,
    limit: int,
) -> None:
    flat = _copy(docs)
    mask = flat._mask(filter, with_ids=True)
    if mask is None:  # no row holds the galaxy
        assert flat.search(terms, boosts, filter, limit) == []
        return
    pruned = flat._pruned(terms, boosts, mask, limit)
    passed = flat._passed(terms, boosts, mask, limit)

    def ordered(candidates: list[Candidate]) -> list[tuple[str, bytes]]:
        return sorted((c.document_id, np.float32(c.score).tobytes()) for c in candidates)

    if pruned is not None:  # None: not provably exact, and `search` takes the pass
        assert ordered(pruned) == ordered(passed)
    # `search` (the pass is kept now: a fresh copy answers through `_pruned`).
    fresh = _copy(docs)
    assert [(c.document_id, c.score) for c in fresh.search(terms, boosts, filter, limit)] == [
        (c.document_id, c.score)
        for c in sorted(sorted(passed, key=lambda c: c.document_id), key=lambda c: -c.score)
    ][:limit]


@settings(max_examples=50, deadline=None)
@given(
    _DOCS,
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=5, unique=True),
    st.fixed_dictionaries({"title": st.sampled_from([0.5, 1.0, 2.0]), "body": st.just(1.0)}),
    st.lists(st.integers(0, 90), max_size=20),
)
def test_listed_rows_sum_as_the_pass(
    docs: list[tuple[list[str], list[str], bool, str]],
    terms: list[str],
    boosts: dict[str, float],
    listed: list[int],
) -> None:
    flat = _copy(docs)
    ids = tuple(f"doc-{n:04d}" for n in listed)
    looked = flat.scores(terms, boosts, SearchFilter(document_ids=ids))
    # The pass over every row, then the listed rows read from it.
    scores = flat._scores(terms, boosts)
    visible = flat._mask(SearchFilter(), with_ids=False)
    assert visible is not None
    expected = {
        d: float(scores[flat._rows[d]])
        for d in ids
        if d in flat._rows and visible[flat._rows[d]] and scores[flat._rows[d]] > 0.0
    }
    assert looked == expected
    rows = np.array([flat._rows[d] for d in ids if d in flat._rows], dtype=np.intp)
    flat._scored.clear()
    assert flat._scores_at(terms, boosts, rows).tobytes() == scores[rows].tobytes()


def test_a_rare_term_above_the_common_bound_is_answered_from_its_rows() -> None:
    # "a" in every row (dense-kept), "h" in one: that row outscores any "a" alone.
    flat = _copy([([], ["a", "a"], False, "g")] * 11 + [([], ["a", "h", "h"], False, "g")])
    mask = flat._mask(SearchFilter(), with_ids=True)
    assert mask is not None
    pruned = flat._pruned(["a", "h"], {"body": 1.0}, mask, 1)
    assert pruned is not None and [c.document_id for c in pruned] == ["doc-0011"]
    # Two wanted, one rare row: an "a"-only row may be the second, so not provable.
    assert flat._pruned(["a", "h"], {"body": 1.0}, mask, 2) is None
    assert [c.document_id for c in flat.search(["a", "h"], {"body": 1.0}, SearchFilter(), 2)] == [
        "doc-0011",
        "doc-0000",
    ]
