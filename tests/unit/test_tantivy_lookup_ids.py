"""A tantivy lookup by id (`TantivyLexicalSearch.scores`) gives each listed document the
same float32 score whatever else is listed, and the score the search gives it.

The embedded re-score relies on it where sources and lookups run side by side
(`QueryPorts.overlap`): the vector candidates' scores are looked up while the lexical
search still runs, so every vector candidate is listed, not only those the lexical
source will miss. tantivy's union sums a document's clauses in the order of its scorer
list, which a lookup reaches by seeking instead of streaming; the corpora here hold
segments past the union's 4,096-document window, replaced and deleted documents, hidden
ones and filters (`tests/unit/test_tantivy_pruning.py`'s corpora and queries).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from tests.unit.test_tantivy_pruning import _build, _corpus, _queries


@pytest.fixture
def lexical(tmp_path: Path) -> Iterator[TantivyLexicalIndex]:
    index = TantivyLexicalIndex(tmp_path / "lexical")
    yield index
    index.close()


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**31 - 1), size=st.sampled_from((600, 5_000)))
def test_a_lookup_scores_each_document_alike_whatever_else_is_listed(
    lexical: TantivyLexicalIndex, seed: int, size: int
) -> None:
    generation = f"g{seed}-{size}"
    _build(lexical, generation, seed, size)
    search = TantivyLexicalSearch(lexical.searchable)
    documents, _replaced, _deleted = _corpus(seed, size)
    ids = [d.document_id for d in documents]
    rng = random.Random(seed)
    looked_up = 0
    for text, boosts, filter, limit in _queries(seed):
        hits = search.search(generation, text, filter, limit * 5, field_boosts=boosts)
        few = sorted(rng.sample(ids, k=min(len(ids), 40)))
        many = sorted(
            {*few, *rng.sample(ids, k=min(len(ids), 200)), *(c.document_id for c in hits)}
        )
        alone = search.scores(
            generation,
            text,
            filter.model_copy(update={"document_ids": tuple(few)}),
            field_boosts=boosts,
        )
        among = search.scores(
            generation,
            text,
            filter.model_copy(update={"document_ids": tuple(many)}),
            field_boosts=boosts,
        )
        assert {d: among[d] for d in few if d in among} == alone
        assert {c.document_id: among.get(c.document_id) for c in hits} == {
            c.document_id: c.score for c in hits
        }
        looked_up += len(alone)
    assert looked_up > 0
