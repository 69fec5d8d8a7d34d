"""The pruned tantivy search (`query.adapters.tantivy_lexical._Pruning`) answers exactly
what the whole query answers: the same documents, the same float32 scores, the same
order with ties broken by `document_id`.

A property drives random corpora shaped like the bench's (a few words in most
documents, a few in almost none, documents sharing their text to force ties, documents
hidden from the lexical lane, replaced and deleted documents that tantivy still counts in
its BM25 statistics), random queries mixing common and rare words under random field
boosts, filters and limits, and compares the adapter with pruning on every query (no
posting minimum) to the adapter that never prunes. It also checks, example by example,
that the pruned path itself (where it answers) returns the whole query's hits, and the
fixed tests below make sure it does answer where it should and steps aside where it
cannot prove its answer.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import tantivy
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import query.adapters.tantivy_lexical as query_tantivy
from contracts.index import Candidate, IndexDocument, SearchFilter, field_boosts
from contracts.index_fields import HIDDEN_FACET
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from tests.conformance.corpus import doc

ANALYZER = "orrery_text_v2_english"
# Share of documents holding each word: common, middling, rare.
WORDS = {
    "alpha": 0.9,
    "beta": 0.7,
    "gamma": 0.5,
    "delta": 0.2,
    "kettle": 0.05,
    "thermos": 0.03,
    "cupboard": 0.02,
    "lantern": 0.01,
}
COMMON = ["alpha", "beta", "gamma", "delta"]
GALAXIES = ("g1", "g2")
STATUSES = ("active", "draft")
_TEXT_ONLY = {"title": 0.0, "body": 0.0, "tags": 0.0}
BOOSTS = (
    {**_TEXT_ONLY, "text": 1.0},  # weighted@3
    {**_TEXT_ONLY, "text": 2.5},
    None,  # the default: title x2, body, tags
    {"title": 0.5, "body": 3.0, "text": 0.25},
)


def _text(rng: random.Random) -> str:
    words = [word for word, share in WORDS.items() if rng.random() < share]
    if words:  # repeats raise term frequencies
        words += rng.choices(words, k=rng.randint(0, 3))
    rng.shuffle(words)
    return " ".join(words)


def _corpus(seed: int, size: int) -> tuple[list[IndexDocument], list[IndexDocument], list[str]]:
    """`size` documents, then replacements of some of them, and ids to delete."""
    rng = random.Random(seed)
    hidden = rng.choice((0.0, 0.1))  # none: the search drops the exclusion
    documents: list[IndexDocument] = []
    for n in range(size):
        if documents and rng.random() < 0.15:
            twin = rng.choice(documents)  # the same text: the same score, a tie
            title, body = twin.title, twin.body
        else:
            title, body = _text(rng), _text(rng)
        documents.append(
            doc(
                f"d{n:04d}",
                galaxy=rng.choice(GALAXIES),
                status=rng.choice(STATUSES),
                title=title,
                body=body,
                facets={HIDDEN_FACET: ("lexical",)} if rng.random() < hidden else None,
            )
        )
    replaced = [
        d.model_copy(update={"revision": 2, "body": _text(rng)})
        for d in rng.sample(documents, k=size // 10)
    ]
    deleted = [d.document_id for d in rng.sample(documents, k=size // 10)]
    return documents, replaced, deleted


def _queries(seed: int) -> list[tuple[str, dict[str, float] | None, SearchFilter, int]]:
    rng = random.Random(seed)
    asked = []
    for _ in range(8):
        words = rng.sample(list(WORDS), k=rng.randint(2, 5))
        if rng.random() < 0.5:  # a rare word beside common ones: what pruning is for
            words = [rng.choice(("thermos", "cupboard", "lantern")), *rng.sample(COMMON, 2)]
        text = " ".join(words)
        filter = rng.choice(
            (
                SearchFilter(),
                SearchFilter(galaxy=rng.choice(GALAXIES)),
                SearchFilter(galaxy=rng.choice(GALAXIES), status=(rng.choice(STATUSES),)),
            )
        )
        asked.append((text, rng.choice(BOOSTS), filter, rng.randint(1, 20)))
    return asked


@pytest.fixture
def lexical(tmp_path: Path) -> Iterator[TantivyLexicalIndex]:
    index = TantivyLexicalIndex(tmp_path / "lexical")
    yield index
    index.close()


def _build(
    lexical: TantivyLexicalIndex, generation: str, seed: int, size: int, *, churn: bool = True
) -> None:
    documents, replaced, deleted = _corpus(seed, size)
    lexical.create(generation, text_analyzer=ANALYZER)
    lexical.apply(generation, documents, [])
    if churn:
        lexical.apply(generation, replaced, [])
        lexical.apply(generation, [], [(document_id, 1) for document_id in deleted])


def _pruned_hits(
    lexical: TantivyLexicalIndex,
    generation: str,
    text: str,
    boosts_override: dict[str, float] | None,
    filter: SearchFilter,
    limit: int,
) -> tuple[list[tuple[float, int]] | None, list[tuple[float, int]]]:
    """What `_Pruning` answers (None: it stepped aside) and the whole query's top hits,
    as (score, segment-local doc) pairs of one searcher."""
    index, _name, analyzer = lexical.searchable(generation)
    schema = index.schema
    searcher = index.searcher()
    terms = list(dict.fromkeys(analyzer.analyze(text)))
    boosts = field_boosts(boosts_override)
    text_query = query_tantivy._text_query(schema, terms, boosts)
    filters = [query_tantivy._hidden(schema)]
    restriction = query_tantivy._filter_query(schema, filter, analyzer)
    if restriction is not None:
        filters.append((tantivy.Occur.Must, tantivy.Query.const_score_query(restriction, 0.0)))
    whole = tantivy.Query.boolean_query([(tantivy.Occur.Must, text_query), *filters])
    pruning = query_tantivy._Pruning(searcher, schema, text_query, filters, limit)
    found = pruning.hits(terms, boosts, 0)

    def plain(hits: list[tuple[float, tantivy.DocAddress]]) -> list[tuple[float, int]]:
        return [(score, address.doc) for score, address in hits]

    reference = plain(query_tantivy._top_hits(searcher, whole, limit))
    return (None if found is None else plain(found)), reference


def _reference(
    lexical: TantivyLexicalIndex,
    generation: str,
    text: str,
    boosts_override: dict[str, float] | None,
    filter: SearchFilter,
    limit: int,
) -> list[tuple[str, float]]:
    """The top `limit` (id, score) of the query as the adapter built it before pruning:
    the text query, the hidden-document exclusion and the filters in one boolean query."""
    index, _name, analyzer = lexical.searchable(generation)
    schema = index.schema
    searcher = index.searcher()
    terms = list(dict.fromkeys(analyzer.analyze(text)))
    clauses = [
        (
            tantivy.Occur.Must,
            query_tantivy._text_query(schema, terms, field_boosts(boosts_override)),
        ),
        query_tantivy._hidden(schema),
    ]
    restriction = query_tantivy._filter_query(schema, filter, analyzer)
    if restriction is not None:
        clauses.append((tantivy.Occur.Must, tantivy.Query.const_score_query(restriction, 0.0)))
    hits = query_tantivy._top_hits(searcher, tantivy.Query.boolean_query(clauses), limit)
    ids = query_tantivy._document_ids(searcher, hits)
    found = sorted(
        zip(ids, (float(score) for score, _address in hits), strict=True),
        key=lambda hit: (-hit[1], hit[0]),
    )
    return found[:limit]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(100, 800))
def test_pruned_search_answers_exactly_what_the_whole_query_answers(
    lexical: TantivyLexicalIndex, seed: int, size: int
) -> None:
    generation = f"prune-{seed:x}-{size}"
    _build(lexical, generation, seed, size)
    try:
        pruned = TantivyLexicalSearch(lexical.searchable, prune_min_postings=0)
        whole = TantivyLexicalSearch(lexical.searchable, prune_min_postings=None)
        for text, boosts, filter, limit in _queries(seed):
            got = pruned.search(generation, text, filter, limit, field_boosts=boosts)
            expected = whole.search(generation, text, filter, limit, field_boosts=boosts)
            assert got == expected  # ids, revisions, float32 scores, order
            reference = _reference(lexical, generation, text, boosts, filter, limit)
            assert [(c.document_id, c.score) for c in got] == reference
            assert got == sorted(got, key=lambda c: (-c.score, c.document_id))
            found, whole_hits = _pruned_hits(lexical, generation, text, boosts, filter, limit)
            event("pruned" if found is not None else "whole query")
            if found is not None:
                assert found == whole_hits
    finally:
        lexical.drop(generation)


def test_a_rare_word_beside_common_ones_is_answered_pruned(
    lexical: TantivyLexicalIndex,
) -> None:
    _build(lexical, "g", seed=7, size=1_500)
    texts = ("alpha beta lantern", "alpha beta gamma cupboard", "beta thermos")
    answered = 0
    for text in texts:
        for filter in (SearchFilter(), SearchFilter(galaxy="g1")):
            found, reference = _pruned_hits(lexical, "g", text, None, filter, 5)
            if found is not None:
                answered += 1
                assert found == reference
    # Each holds a word in at most 1/33 of the documents beside words in most of them.
    assert answered >= 4


def test_common_words_alone_run_the_whole_query(lexical: TantivyLexicalIndex) -> None:
    _build(lexical, "g", seed=8, size=600)
    found, reference = _pruned_hits(lexical, "g", "alpha beta gamma", None, SearchFilter(), 10)
    assert found is None  # no clause is rare enough to probe
    assert len(reference) >= 10  # and the documents tied with the 10th
    search = TantivyLexicalSearch(lexical.searchable, prune_min_postings=0)
    got = search.search("g", "alpha beta gamma", SearchFilter(), 10)
    assert [c.score for c in got] == [score for score, _doc in reference][:10]


def test_too_few_probed_documents_run_the_whole_query(lexical: TantivyLexicalIndex) -> None:
    """A limit past what the rare word's documents can fill: the probe cannot bound the
    rest, and the whole query answers (documents without the rare word included)."""
    _build(lexical, "g", seed=9, size=800, churn=False)
    found, reference = _pruned_hits(lexical, "g", "alpha lantern", None, SearchFilter(), 200)
    assert found is None
    search = TantivyLexicalSearch(lexical.searchable, prune_min_postings=0)
    got = search.search("g", "alpha lantern", SearchFilter(), 200)
    assert len(got) == 200 <= len(reference)
    assert [c.score for c in got] == [score for score, _doc in reference][:200]
    assert len(search.search("g", "lantern", SearchFilter(), 1_000)) < 200


def test_the_posting_minimum_keeps_small_queries_whole(lexical: TantivyLexicalIndex) -> None:
    _build(lexical, "g", seed=10, size=300)
    minimum = query_tantivy.DEFAULT_PRUNE_MIN_POSTINGS
    index, _name, analyzer = lexical.searchable("g")
    searcher = index.searcher()
    terms = list(dict.fromkeys(analyzer.analyze("alpha lantern")))
    pruning = query_tantivy._Pruning(searcher, index.schema, tantivy.Query.all_query(), [], 5)
    # 300 documents hold far fewer postings than the default minimum.
    assert pruning.hits(terms, {"text": 1.0}, minimum) is None


def _scores(candidates: list[Candidate]) -> list[float]:
    return [c.score for c in candidates]


def test_deleted_documents_still_count_in_the_bound(lexical: TantivyLexicalIndex) -> None:
    """tantivy's N counts deleted documents until a merge: the bound is taken from its
    own explanation, so a corpus with many deletions prunes exactly as well."""
    documents, _replaced, _deleted = _corpus(11, 1_200)
    lexical.create("g", text_analyzer=ANALYZER)
    lexical.apply("g", documents, [])
    lexical.apply("g", [], [(d.document_id, 1) for d in documents[::2]])
    pruned = TantivyLexicalSearch(lexical.searchable, prune_min_postings=0)
    whole = TantivyLexicalSearch(lexical.searchable, prune_min_postings=None)
    for text in ("alpha beta lantern", "gamma delta thermos", "alpha kettle"):
        got = pruned.search("g", text, SearchFilter(), 7)
        assert got == whole.search("g", text, SearchFilter(), 7)
        assert _scores(got) == sorted(_scores(got), reverse=True)


def test_past_tantivys_union_window_the_answers_stay_exact(
    lexical: TantivyLexicalIndex,
) -> None:
    """tantivy's union buffers 4,096 documents at a time and a seek from the restricted
    query refills that window where the whole query streams through it: a corpus of
    several windows (and scorers running out at different points) answers alike."""
    _build(lexical, "g", seed=12, size=12_000)
    pruned = TantivyLexicalSearch(lexical.searchable, prune_min_postings=0)
    whole = TantivyLexicalSearch(lexical.searchable, prune_min_postings=None)
    answered = 0
    for text, boosts, filter, limit in _queries(12) + _queries(13) + _queries(14):
        got = pruned.search("g", text, filter, limit * 5, field_boosts=boosts)
        assert got == whole.search("g", text, filter, limit * 5, field_boosts=boosts)
        reference = _reference(lexical, "g", text, boosts, filter, limit * 5)
        assert [(c.document_id, c.score) for c in got] == reference
        found, whole_hits = _pruned_hits(lexical, "g", text, boosts, filter, limit * 5)
        if found is not None:
            answered += 1
            assert found == whole_hits
    assert answered >= 5
