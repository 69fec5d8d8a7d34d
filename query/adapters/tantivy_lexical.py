"""BM25 search over the tantivy indexes that `projector.adapters.tantivy_lexical` writes.

The query is built from analyzed tokens, never parsed: user text such as
`title:"x" AND (y -z*)` is a bag of words, so no input can raise a syntax error. Query
text is analyzed with the text analyzer of the generation searched, the very object the
projector registered with its index, so stemming and folding are exactly those of the
indexed text.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import tantivy

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.flat_lexical import FlatLexical
from contracts.index import Candidate, SearchFilter, field_boosts, id_lookup_size, is_unicode
from contracts.index_fields import (
    DOCUMENT_ID,
    DOCUMENT_KEY_HIGH,
    DOCUMENT_KEY_LOW,
    FACET_SEPARATOR,
    FACETS,
    GALAXY,
    REVISION,
    RING,
    RING_PATH,
    SOURCE_TEXT_FIELDS,
    STATUS,
    STATUS_KEY,
    UPDATED_AT,
    UPDATED_AT_MICROS,
    VISIBILITY,
    document_id_of_key,
    has_combined_field,
    hidden_term,
    status_key,
)
from contracts.timing import engine_call, gil_let_go

__all__ = ["TantivyLexicalSearch"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_new = tuple.__new__
# Below this many values a disjunction of term queries beats a term-set query (which
# costs ~0.25 ms even for one value at 10k documents; measured with tantivy 0.27).
_TERM_SET_MIN_VALUES = 128
# tantivy-py raises these for engine failures.
_DRIVER_ERRORS = (ValueError, OSError, RuntimeError)
# `QueryPlan.engine_ms` keys: tantivy's top-k searches, its fast-field reads of the hits
# (schema version 5) and its stored-document reads (older indexes, odd ids).
ENGINE_SEARCH = "tantivy_search"
ENGINE_FAST_FIELDS = "tantivy_fast_fields"
ENGINE_DOCS = "tantivy_doc_reads"
# ... and the scoring of a generation's in-memory copy (`contracts.flat_lexical`).
ENGINE_FLAT = "flat_lexical"

_Hit = tuple[Any, tantivy.DocAddress]

# The pruned search (`_Pruning`) is tried when the query's terms hold at least this many
# postings together: below it the whole query costs a few milliseconds at most, and a
# probe's fixed costs eat most of what it saves (100k documents, where a typical query
# holds ~200k postings: p50 0.85x, p95 1.05x at 50,000; 1M: ~2M, see docs/bench).
DEFAULT_PRUNE_MIN_POSTINGS = 200_000
# ... and restricted to documents holding at most these shares of the query's postings
# (probe; second run): the restricted query seeks the text query's union per document,
# which costs more than a pass over it once they hold 1/11 of its postings, 0.75x at
# 1/16, under 0.5x below 1/32 (1M documents, 200 `bench/topk.py` queries; session 18).
_PROBE_MAX_SHARE = 1 / 16
_RUN_MAX_SHARE = 1 / 32
# See `_Pruning.hits`: when a probe is worth trying.
_PROBE_HOPE = 2.0
# tantivy's BM25 (`src/query/bm25.rs`): a term scores at most idf * (1 + k1) * boost.
_K1 = 1.2
# Slack on a bound computed here in float64 against scores tantivy sums in float32 (a
# few ulps, 2^-24 each, relative): far below this, far above nothing.
_BOUND_SLACK = 1e-4
_EXPLAINED_N = re.compile(r'"value":\s*([0-9.eE+-]+),\s*"description":\s*"N, total number of docs"')


class TantivyLexicalSearch:
    """`LexicalSearch` over what `index_provider` returns per generation: the
    `tantivy.Index`, the name of its text analyzer and that analyzer
    (`projector.adapters.tantivy_lexical.TantivyLexicalIndex.searchable`).

    Guarantees, beyond the port's:
    - Query text is analyzed with the generation's own analyzer (lowercase, ASCII
      folding, its language's stemmer) and becomes an OR of per-field term queries, each
      field boosted as `field_boosts` says (default `DEFAULT_FIELD_BOOSTS`: title
      ×`TITLE_BOOST`); repeated words (after stemming) count once. On an index without
      the combined `text` field (analyzer version 1), a `text` boost applies to title,
      body and tags instead. Text with no searchable token (only punctuation) matches
      nothing; blank text means "filter only".
    - Filters are wrapped in a zero constant score, so a document's score is the same
      with and without them. Filter values that are not valid Unicode match nothing.
    - Ties at the `limit` boundary are resolved by `document_id` exactly, not by the
      engine's internal order.
    - A query holding common terms may be answered from fewer documents (`_Pruning`,
      from `prune_min_postings` postings on; None: never) only where the BM25 bounds
      prove the answer is the whole query's: the same documents, scores and order.
    - An unknown generation (the provider raises `KeyError`) raises
      `OrreryError(COVERAGE_UNAVAILABLE)`; engine failures raise `DependencyUnavailable`.
    """

    def __init__(
        self,
        index_provider: Callable[[str], tuple[tantivy.Index, str, tantivy.TextAnalyzer]],
        *,
        flat_provider: Callable[[str], FlatLexical | None] | None = None,
        prune_min_postings: int | None = DEFAULT_PRUNE_MIN_POSTINGS,
    ) -> None:
        self._index_provider = index_provider
        self._flat_provider = flat_provider
        # None: never prune (every search runs the whole query; the A/B reference).
        self._prune_min_postings = prune_min_postings
        self._statuses = _StatusNames()

    def search(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        limit: int,
        *,
        field_boosts: Mapping[str, float] | None = None,
    ) -> list[Candidate]:
        _boosts(field_boosts, combined_field=True)  # An unknown field is refused anywhere.
        if limit <= 0 or filter.matches_nothing():
            return []  # tantivy panics on a zero limit.
        index, analyzer_name, analyzer = self._index(generation_id)
        boosts = _boosts(field_boosts, combined_field=has_combined_field(analyzer_name))
        try:
            terms: list[str] = []
            if query_text.strip():
                terms = _query_terms(analyzer, query_text)
                if not terms or not boosts:
                    return []
                flat = self._flat(generation_id)
                if flat is not None:
                    with engine_call(ENGINE_FLAT):
                        found = flat.search(terms, boosts, filter, limit)
                    if found is not None:
                        return found
            schema = index.schema
            restriction = _filter_query(schema, filter, analyzer)
            searcher = index.searcher()
            read = _HitReader(searcher, generation_id, self._statuses)
            if not terms:
                return _filter_matches(searcher, _visible(schema, restriction), limit, read)
            text_query = _text_query(schema, terms, boosts)
            filters: list[tuple[tantivy.Occur, tantivy.Query]] = []
            with engine_call(ENGINE_SEARCH):
                hiding = searcher.doc_freq(FACETS, hidden_term("lexical")) > 0
            if hiding:
                filters.append(_hidden(schema))
            if restriction is not None:
                filters.append(
                    (tantivy.Occur.Must, tantivy.Query.const_score_query(restriction, 0.0))
                )
            hits: list[_Hit] | None = None
            if self._prune_min_postings is not None:
                pruning = _Pruning(searcher, schema, text_query, filters, limit)
                hits = pruning.hits(terms, boosts, self._prune_min_postings)
            if hits is None:
                # Without filters (no document hidden from this lane: the exclusion would
                # match nothing) the bare union streams a quarter faster than inside a
                # boolean query (1M documents), with the same scores.
                query = (
                    tantivy.Query.boolean_query([(tantivy.Occur.Must, text_query), *filters])
                    if filters
                    else text_query
                )
                hits = _top_hits(searcher, query, limit)
            return _best(hits, limit, read)
        except _DRIVER_ERRORS as exc:
            raise DependencyUnavailable(
                "tantivy", f"search failed: {exc}", {"generation_id": generation_id}
            ) from exc

    def scores(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        *,
        field_boosts: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """`LexicalSearch.scores`: the query `search` runs, collected whole (at most one
        live document per listed id) and reading only each hit's `document_id` (from
        fast fields where the index has them)."""
        _boosts(field_boosts, combined_field=True)
        size = id_lookup_size(filter, "tantivy")
        if size == 0 or filter.matches_nothing():
            return {}
        index, analyzer_name, analyzer = self._index(generation_id)
        boosts = _boosts(field_boosts, combined_field=has_combined_field(analyzer_name))
        try:
            terms: list[str] = []
            if query_text.strip():
                terms = _query_terms(analyzer, query_text)
                if not terms or not boosts:
                    return {}
                flat = self._flat(generation_id)
                if flat is not None:
                    with engine_call(ENGINE_FLAT):
                        scored = flat.scores(terms, boosts, filter)
                    if scored is not None:
                        return scored
            schema = index.schema
            restriction = _visible(schema, _filter_query(schema, filter, analyzer))
            searcher = index.searcher()
            if not terms:
                with engine_call(ENGINE_SEARCH):
                    hits = searcher.search(restriction, size, count=False).hits
                return dict.fromkeys(_document_ids(searcher, hits), 0.0)
            query = tantivy.Query.boolean_query(
                [
                    (tantivy.Occur.Must, _text_query(schema, terms, boosts)),
                    (tantivy.Occur.Must, tantivy.Query.const_score_query(restriction, 0.0)),
                ]
            )
            with engine_call(ENGINE_SEARCH):
                hits = searcher.search(query, size, count=False).hits
            return {
                document_id: float(score)
                for document_id, (score, _address) in zip(
                    _document_ids(searcher, hits), hits, strict=True
                )
            }
        except _DRIVER_ERRORS as exc:
            raise DependencyUnavailable(
                "tantivy", f"score lookup failed: {exc}", {"generation_id": generation_id}
            ) from exc

    def _flat(self, generation_id: str) -> FlatLexical | None:
        """The generation's in-memory copy, if the provider offers one."""
        if self._flat_provider is None:
            return None
        try:
            return self._flat_provider(generation_id)
        except KeyError:
            return None  # `_index` reports the unknown generation

    def _index(self, generation_id: str) -> tuple[tantivy.Index, str, tantivy.TextAnalyzer]:
        try:
            return self._index_provider(generation_id)
        except KeyError as exc:
            raise OrreryError(
                ErrorCode.COVERAGE_UNAVAILABLE,
                f"no lexical index for generation {generation_id!r}",
                {"engine": "tantivy", "generation_id": generation_id},
            ) from exc


def _boosts(overrides: Mapping[str, float] | None, *, combined_field: bool) -> dict[str, float]:
    try:
        return field_boosts(overrides, combined_field=combined_field)
    except ValueError as exc:
        raise OrreryError(ErrorCode.INVALID_REQUEST, str(exc)) from exc


def _text_query(
    schema: tantivy.Schema, terms: list[str], boosts: Mapping[str, float]
) -> tantivy.Query:
    clauses: list[tuple[tantivy.Occur, tantivy.Query]] = []
    for term in terms:
        for field_name, boost in boosts.items():
            query = tantivy.Query.term_query(schema, field_name, term, index_option="freq")
            if boost != 1.0:
                query = tantivy.Query.boost_query(query, boost)
            clauses.append((tantivy.Occur.Should, query))
    return tantivy.Query.boolean_query(clauses)


def _hidden(schema: tantivy.Schema) -> tuple[tantivy.Occur, tantivy.Query]:
    """The clause that keeps documents hidden from the lexical lane out of a search."""
    return (
        tantivy.Occur.MustNot,
        tantivy.Query.term_query(schema, FACETS, hidden_term("lexical")),
    )


def _visible(schema: tantivy.Schema, restriction: tantivy.Query | None) -> tantivy.Query:
    """`restriction` (None: every document) less the documents hidden from this lane."""
    return tantivy.Query.boolean_query(
        [
            (tantivy.Occur.Must, tantivy.Query.all_query() if restriction is None else restriction),
            _hidden(schema),
        ]
    )


def _filter_query(
    schema: tantivy.Schema, filter: SearchFilter, analyzer: tantivy.TextAnalyzer
) -> tantivy.Query | None:
    """The conjunction of the filter's restrictions; `None` if it restricts nothing."""
    clauses: list[tantivy.Query] = []
    if filter.galaxy is not None:
        clauses.append(_any_of(schema, GALAXY, (filter.galaxy,)))
    if filter.status is not None:
        clauses.append(_any_of(schema, STATUS, filter.status))
    if filter.visibility is not None:
        clauses.append(_any_of(schema, VISIBILITY, filter.visibility))
    if filter.updated_after is not None or filter.updated_before is not None:
        # On integer microseconds: the date field is indexed at second precision.
        clauses.append(
            tantivy.Query.range_query(
                schema,
                UPDATED_AT_MICROS,
                tantivy.FieldType.Integer,
                lower_bound=_epoch_micros(filter.updated_after),
                upper_bound=_epoch_micros(filter.updated_before),
                include_lower=True,
                include_upper=True,
            )
        )
    for name, values in sorted(filter.facets.items()):
        terms = [f"{name}{FACET_SEPARATOR}{value}" for value in values]
        clauses.append(_any_of(schema, FACETS, terms))
    if filter.document_ids is not None:
        clauses.append(_any_of(schema, DOCUMENT_ID, filter.document_ids))
    if filter.rings is not None:
        clauses.append(_any_of(schema, RING, filter.rings))
    if filter.ring_trees is not None:
        clauses.append(_any_of(schema, RING_PATH, filter.ring_trees))
    for group in filter.phrases:
        clauses.append(_any_phrase(schema, group, analyzer))
    if not clauses:
        return None
    if len(clauses) == 1:
        return clauses[0]
    return tantivy.Query.boolean_query([(tantivy.Occur.Must, clause) for clause in clauses])


def _any_of(schema: tantivy.Schema, field_name: str, values: Sequence[str]) -> tantivy.Query:
    """Matches documents holding at least one of `values` in `field_name`.

    A value that is not valid Unicode (a lone surrogate) is never stored: it matches nothing.
    """
    unique = [value for value in dict.fromkeys(values) if is_unicode(value)]
    if not unique:
        return tantivy.Query.empty_query()
    if len(unique) >= _TERM_SET_MIN_VALUES:
        return tantivy.Query.term_set_query(schema, field_name, unique)
    terms = [tantivy.Query.term_query(schema, field_name, value) for value in unique]
    if len(terms) == 1:
        return terms[0]
    return tantivy.Query.boolean_query([(tantivy.Occur.Should, term) for term in terms])


def _any_phrase(
    schema: tantivy.Schema, phrases: Sequence[str], analyzer: tantivy.TextAnalyzer
) -> tantivy.Query:
    """Matches documents where one of `phrases` occurs in a source text field: its tokens,
    analyzed by the generation's analyzer (not deduplicated), adjacent and in order.

    A phrase without tokens matches nothing. tantivy refuses one-token phrases: those are
    term queries. Values of a multi-valued field (tags) are not adjacent to each other.
    """
    clauses: list[tuple[tantivy.Occur, tantivy.Query]] = []
    for phrase in dict.fromkeys(phrases):
        words = analyzer.analyze(phrase.encode("utf-8", "replace").decode("utf-8"))
        for field_name in SOURCE_TEXT_FIELDS if words else ():
            if len(words) == 1:
                query = tantivy.Query.term_query(schema, field_name, words[0])
            else:
                query = tantivy.Query.phrase_query(schema, field_name, [*words])
            clauses.append((tantivy.Occur.Should, query))
    if not clauses:
        return tantivy.Query.empty_query()
    return tantivy.Query.boolean_query(clauses)


def _epoch_micros(value: datetime | None) -> int | None:
    """Microseconds since the Unix epoch; a naive datetime is taken as UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _MICROSECOND


def _filter_matches(
    searcher: tantivy.Searcher,
    restriction: tantivy.Query | None,
    limit: int,
    read: _HitReader,
) -> list[Candidate]:
    query = tantivy.Query.all_query() if restriction is None else restriction
    gil_let_go()
    with engine_call(ENGINE_SEARCH):
        hits = searcher.search(
            query, limit, count=False, order_by_field=DOCUMENT_ID, order=tantivy.Order.Asc
        ).hits
    return read([(0.0, address) for _value, address in hits])


def _top_hits(searcher: tantivy.Searcher, query: tantivy.Query, limit: int) -> list[_Hit]:
    """The hits of `query` scoring at least its `limit`-th best score (all of them if it
    matches fewer), best first: the fetch widens past the ties at the boundary, which
    tantivy breaks by its internal order."""
    # Each fetch is a pass over every matching document, and a wider top costs nothing
    # measurable beside it (1M: top 101 to 808 within noise). Fetching `limit + 1` first,
    # 83 of `bench/topk.py`'s 200 queries tied at the boundary and ran twice; at
    # `2 * limit + 1`, none.
    fetch = 2 * limit + 1
    gil_let_go()  # the search below lets it go: a request's thread may go on (query.service)
    while True:
        with engine_call(ENGINE_SEARCH):
            hits: list[_Hit] = searcher.search(query, fetch, count=False).hits
        if len(hits) < fetch or hits[-1][0] < hits[limit - 1][0]:
            break
        fetch *= 2
    if len(hits) > limit:
        boundary = hits[limit - 1][0]
        hits = [hit for hit in hits if hit[0] >= boundary]
    return hits


def _best(hits: list[_Hit], limit: int, read: _HitReader) -> list[Candidate]:
    """Top `limit` of `_top_hits` by score, then `document_id`."""
    candidates = read(hits)
    candidates.sort(key=lambda candidate: (-candidate.score, candidate.document_id))
    return candidates[:limit]


class _Clause(NamedTuple):
    """One term query of the text query: a term in a field, its boost, and how many
    documents of the searcher's snapshot hold it (deleted ones included, as tantivy
    counts them for BM25)."""

    field: str
    term: str
    boost: float
    doc_freq: int

    def bound(self, documents: float) -> float:
        """The most this clause adds to a document's score when the snapshot counts
        `documents` documents (tantivy: idf * (1 + k1) * boost, times tf / (tf + norm) < 1)."""
        documents = max(documents, self.doc_freq)
        idf = math.log1p((documents - self.doc_freq + 0.5) / (self.doc_freq + 0.5))
        return self.boost * (1.0 + _K1) * idf


class _Pruning:
    """The whole query's top hits, found among fewer documents (MaxScore, per query).

    tantivy-py collects through a `MultiCollector`, which scores every document a query
    matches (tantivy's block-max WAND only runs under a bare `TopDocs` collector), so a
    query holding a common term costs a pass over that term's postings. But a document
    matching none of the rarer clauses scores at most the sum of the other clauses'
    bounds (`_Clause.bound`); once the `limit`-th best score is known to exceed that sum,
    the top hits, and every document tied with the `limit`-th, are among the documents
    matching a rarer clause. So:

    1. Probe: the whole query (same text query, same filters: same scores) restricted
       to documents matching the rarest clause (more, while fewer than `limit` match).
       Its `limit`-th score is a lower bound of the whole query's.
    2. The clauses whose bounds, weakest first, stay below that score together are
       optional; the rest are needed. If the probe held every needed clause, its hits
       are the answer; else the query is run once more, restricted to the documents
       matching a needed clause.

    The bounds use the document count tantivy scored with (read from its explanation of
    a hit: it counts deleted documents too) and each clause's document frequency in the
    same snapshot, with `_BOUND_SLACK` for float32 rounding. Anything this cannot prove
    returns None: the caller runs the whole query. Scores come from the same scorer over
    the same text query, so they are the whole query's. (tantivy's union adds up a
    document's clauses in the order of its scorer list, which drops a clause whose
    postings ran out by moving the last one into its place; a restricted query seeks
    where the whole one streams, so after two clauses ran out in a segment the two orders
    could differ, and a float32 sum of three or more clauses with them, in the last bit.
    The re-score's lookup by id (`scores`) has always relied on the same; no difference
    was seen in 1,800 distinct queries at 1M nor in `tests/unit/test_tantivy_pruning.py`.)
    """

    def __init__(
        self,
        searcher: tantivy.Searcher,
        schema: tantivy.Schema,
        text_query: tantivy.Query,
        filters: Sequence[tuple[tantivy.Occur, tantivy.Query]],
        limit: int,
    ) -> None:
        self._searcher = searcher
        self._schema = schema
        self._text_query = text_query
        self._filters = filters
        self._limit = limit

    def hits(
        self, terms: Sequence[str], boosts: Mapping[str, float], min_postings: int
    ) -> list[_Hit] | None:
        """`_top_hits` of the whole query, or None where pruning does not pay or cannot
        be proven."""
        searcher, limit = self._searcher, self._limit
        with engine_call(ENGINE_SEARCH):
            clauses = [
                _Clause(field_name, term, boost, searcher.doc_freq(field_name, term))
                for term in terms
                for field_name, boost in boosts.items()
            ]
            planned_documents = searcher.num_docs
        clauses = [clause for clause in clauses if clause.doc_freq > 0]
        postings = sum(clause.doc_freq for clause in clauses)
        if len(clauses) < 2 or postings < min_postings:
            return None
        # The probe: the rarest clauses (highest bounds) the share allows, at least one.
        rarest = sorted(clauses, key=lambda clause: clause.bound(planned_documents), reverse=True)
        probed: list[_Clause] = []
        share = 0
        for clause in rarest[:-1]:
            share += clause.doc_freq
            if share > _PROBE_MAX_SHARE * postings:
                break
            probed.append(clause)
        if not probed:
            return None  # about as costly as the whole query
        # The probe's `limit`-th score came out between 1.2 and 1.9 times its strongest
        # clause's idf (1M documents, session 18): past twice that, the clauses left out
        # cannot all be optional, and the probe would be wasted.
        left_out = sum(clause.bound(planned_documents) for clause in rarest[len(probed) :])
        if left_out >= _PROBE_HOPE * probed[0].bound(planned_documents) / (1.0 + _K1):
            return None
        hits = self._restricted_hits(probed)
        if len(hits) < limit:
            return None
        threshold = float(hits[limit - 1][0])
        documents = self._scored_documents(hits[0][1])
        if documents is None:
            return None
        optional_bound = 0.0
        optional: set[_Clause] = set()
        for clause in sorted(clauses, key=lambda clause: clause.bound(documents)):
            bound = clause.bound(documents)
            if (optional_bound + bound) * (1.0 + _BOUND_SLACK) >= threshold:
                break
            optional_bound += bound
            optional.add(clause)
        needed = [clause for clause in clauses if clause not in optional]
        if not optional:
            return None
        if set(needed) <= set(probed):
            return hits
        if sum(clause.doc_freq for clause in needed) > _RUN_MAX_SHARE * postings:
            return None
        hits = self._restricted_hits(needed)
        # More documents than the probe's: the `limit`-th score can only have grown.
        if len(hits) < limit or hits[limit - 1][0] <= optional_bound * (1.0 + _BOUND_SLACK):
            return None
        return hits

    def _restricted_hits(self, clauses: Sequence[_Clause]) -> list[_Hit]:
        """`_top_hits` of the whole query over the documents matching one of `clauses`
        (a zero constant score: the scores stay the whole query's)."""
        schema = self._schema
        matching = [
            (
                tantivy.Occur.Should,
                tantivy.Query.term_query(schema, c.field, c.term, index_option="basic"),
            )
            for c in clauses
        ]
        restriction = (
            matching[0][1] if len(matching) == 1 else tantivy.Query.boolean_query(matching)
        )
        query = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Must, self._text_query),
                *self._filters,
                (tantivy.Occur.Must, tantivy.Query.const_score_query(restriction, 0.0)),
            ]
        )
        return _top_hits(self._searcher, query, self._limit)

    def _scored_documents(self, address: tantivy.DocAddress) -> float | None:
        """An upper bound of the document count tantivy's BM25 used in this snapshot,
        from its explanation of a hit (a float32 there: rounded up here)."""
        with engine_call(ENGINE_SEARCH):
            explained = self._text_query.explain(self._searcher, address).to_json()
        found = _EXPLAINED_N.search(explained)
        if found is None:
            return None
        return float(found.group(1)) * (1.0 + 2.0**-23) + 1.0


class _StatusNames:
    """`status_key` -> status, per generation, from the index's own `STATUS` terms.

    Refreshed when a key is not known yet (a status first written after the last
    refresh). A key that two of the terms share maps to None: its hits read the stored
    document instead. The map of a generation only ever gains keys, and each entry is a
    pure function of the terms, so readers on other threads never see a wrong entry.
    """

    def __init__(self) -> None:
        self._names: dict[str, dict[int, str | None]] = {}
        self._refresh_lock = threading.Lock()

    def names(
        self, generation_id: str, searcher: tantivy.Searcher, keys: Sequence[int | None]
    ) -> dict[int, str | None]:
        names = self._names.get(generation_id)
        if names is not None and all(key in names for key in keys if key is not None):
            return names
        with self._refresh_lock:
            fresh: dict[int, str | None] = {}
            for term, _count in searcher.terms_with_prefix(STATUS, ""):
                key = status_key(term)
                fresh[key] = term if fresh.get(key, term) == term else None
            self._names[generation_id] = fresh
        return fresh


class _HitReader:
    """Candidates of hits: from the fast fields of schema version 5 (document key,
    revision, `updated_at` microseconds, status key) in five batched column reads, or,
    for an index without them or a hit lacking one (a non-UUID id), from the stored
    document. Both give the same values (`tests/unit/test_tantivy_hit_keys.py` compares
    a version 4 and a version 5 index; the conformance suite checks every field)."""

    def __init__(
        self, searcher: tantivy.Searcher, generation_id: str, statuses: _StatusNames
    ) -> None:
        self._searcher = searcher
        self._generation_id = generation_id
        self._statuses = statuses

    def __call__(self, hits: Sequence[tuple[Any, tantivy.DocAddress]]) -> list[Candidate]:
        if not hits:
            return []
        searcher = self._searcher
        addresses = [address for _score, address in hits]
        with engine_call(ENGINE_FAST_FIELDS):
            columns = _fast_columns(searcher, addresses)
            names = (
                None
                if columns is None
                else self._statuses.names(self._generation_id, searcher, columns[4])
            )
        if columns is None or names is None:
            with engine_call(ENGINE_DOCS):
                return [_candidate(searcher, address, float(score)) for score, address in hits]
        candidates: list[Candidate] = []
        missing: list[int] = []
        for (score, _address), high, low, revision, micros, key in zip(hits, *columns, strict=True):
            status = None if key is None else names.get(key)
            if high is None or low is None or revision is None or micros is None or status is None:
                missing.append(len(candidates))
                candidates.append(_MISSING)
                continue
            # `tuple.__new__`: half the time of the named tuple's generated `__new__`.
            candidates.append(
                _new(
                    Candidate,
                    (
                        document_id_of_key(high, low),
                        revision,
                        float(score),
                        _EPOCH + micros * _MICROSECOND,
                        status,
                    ),
                )
            )
        if missing:
            with engine_call(ENGINE_DOCS):
                for position in missing:
                    score, address = hits[position]
                    candidates[position] = _candidate(searcher, address, float(score))
        return candidates


def _fast_columns(
    searcher: tantivy.Searcher, addresses: list[tantivy.DocAddress]
) -> tuple[list[Any], list[Any], list[Any], list[Any], list[Any]] | None:
    """The fast-field columns a candidate needs, per address; None for an index without
    them (schema version 4 and older: tantivy refuses the unknown field). Any other
    refusal also falls back to stored documents: slower, never different."""
    try:
        keys = searcher.fast_field_values(STATUS_KEY, addresses)
    except ValueError:
        return None
    return (
        searcher.fast_field_values(DOCUMENT_KEY_HIGH, addresses),
        searcher.fast_field_values(DOCUMENT_KEY_LOW, addresses),
        searcher.fast_field_values(REVISION, addresses),
        searcher.fast_field_values(UPDATED_AT_MICROS, addresses),
        keys,
    )


def _document_ids(
    searcher: tantivy.Searcher, hits: Sequence[tuple[Any, tantivy.DocAddress]]
) -> list[str]:
    """The `document_id` of each hit: from the document-key fast fields where the index
    has them, else from the stored document."""
    addresses = [address for _score, address in hits]
    highs: list[Any]
    lows: list[Any]
    with engine_call(ENGINE_FAST_FIELDS):
        try:
            highs = searcher.fast_field_values(DOCUMENT_KEY_HIGH, addresses)
        except ValueError:  # schema version 4 and older
            highs = lows = [None] * len(addresses)
        else:
            lows = searcher.fast_field_values(DOCUMENT_KEY_LOW, addresses)
    ids = [
        "" if high is None or low is None else document_id_of_key(high, low)
        for high, low in zip(highs, lows, strict=True)
    ]
    missing = [position for position, document_id in enumerate(ids) if not document_id]
    if missing:
        with engine_call(ENGINE_DOCS):
            for position in missing:
                ids[position] = _document_id(searcher, addresses[position])
    return ids


def _document_id(searcher: tantivy.Searcher, address: tantivy.DocAddress) -> str:
    document_id = searcher.doc(address).get_first(DOCUMENT_ID)
    if not isinstance(document_id, str):
        raise OrreryError(
            ErrorCode.INTERNAL,
            "index document lacks its stored document_id",
            {"engine": "tantivy"},
        )
    return document_id


def _candidate(searcher: tantivy.Searcher, address: tantivy.DocAddress, score: float) -> Candidate:
    document = searcher.doc(address)
    document_id = document.get_first(DOCUMENT_ID)
    revision = document.get_first(REVISION)
    updated_at = document.get_first(UPDATED_AT)
    status = document.get_first(STATUS)
    if not (
        isinstance(document_id, str)
        and isinstance(revision, int)
        and isinstance(updated_at, datetime)
        and isinstance(status, str)
    ):
        raise OrreryError(
            ErrorCode.INTERNAL,
            "index document lacks a stored field a candidate needs",
            {"engine": "tantivy", "document": repr(document.to_dict())},
        )
    return Candidate(
        document_id=document_id,
        revision=revision,
        score=score,
        updated_at=updated_at,
        status=status,
    )


# A placeholder for a hit read from its stored document afterwards.
_MISSING = Candidate(document_id="", revision=0, score=0.0, updated_at=_EPOCH, status="")


# Per thread: `(analyzer, query text, its distinct terms)` of the last analysis, so a
# query's search and its re-score's lookup (same thread, same text) analyze it once.
_LAST_TERMS = threading.local()


def _query_terms(analyzer: tantivy.TextAnalyzer, query_text: str) -> list[str]:
    """The distinct terms `analyzer` makes of `query_text`, in order (a fresh list)."""
    last: tuple[tantivy.TextAnalyzer, str, tuple[str, ...]] | None = getattr(
        _LAST_TERMS, "last", None
    )
    if last is not None and last[0] is analyzer and last[1] == query_text:
        return list(last[2])
    # Lone surrogates (stdlib `json` lets "\ud800" through) become separators.
    text = query_text.encode("utf-8", "replace").decode("utf-8")
    terms = tuple(dict.fromkeys(analyzer.analyze(text)))
    _LAST_TERMS.last = (analyzer, query_text, terms)
    return list(terms)
