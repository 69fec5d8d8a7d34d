"""BM25 search over the OpenSearch indexes that `projector.adapters.opensearch_lexical` writes.

User text goes into a `multi_match` query, which analyzes it with the index's query
analyzer and never parses it: `title:"x" AND (y -z*)` is a bag of words, so no input can
raise a syntax error. Each generation's index carries its own text analyzer (stemming
language included), so query text is analyzed exactly as that generation's text was.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError
from opensearchpy.exceptions import OpenSearchException, TransportError

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import Candidate, SearchFilter, field_boosts, id_lookup_size, is_unicode
from contracts.index_fields import (
    DOCUMENT_ID,
    FACET_SEPARATOR,
    FACETS,
    GALAXY,
    REVISION,
    RING,
    RING_PATH,
    SOURCE_TEXT_FIELDS,
    STATUS,
    TEXT,
    TEXT_ANALYZER_V1,
    UPDATED_AT_MICROS,
    VISIBILITY,
    has_combined_field,
    hidden_term,
)
from contracts.shards import report_shards
from contracts.timing import engine_call, engine_reported

__all__ = ["DEFAULT_INDEX_PREFIX", "DEFAULT_SEARCH_TYPE", "OpenSearchLexicalSearch", "SearchType"]

DEFAULT_INDEX_PREFIX = "orrery"
REQUEST_TIMEOUT_S = 10
MAX_RETRIES = 2

_ENGINE = "opensearch"
_GENERATION_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_INDEX_PREFIX = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
# `index.max_result_window` (10 000 by default) caps one page; larger limits page on.
_MAX_PAGE = 10_000
# The first fetch of a ranked search asks `limit // _TIE_SLACK` more hits than needed:
# BM25 scores tie often (Lucene stores field lengths in one byte), and a tie group across
# the limit costs a second round trip. 100k synthetic corpus, 200 queries, limit 200:
# 118 needed more than limit + 1 hits, none more than 226 (session 15).
_TIE_SLACK = 4
# `index.max_terms_count` (65 536 by default) caps one `terms` query.
_MAX_TERMS = 65_536
_DOCVALUE_FIELDS = [DOCUMENT_ID, REVISION, UPDATED_AT_MICROS, STATUS]
_SCORE_SORT: list[Any] = [{"_score": "desc"}, {DOCUMENT_ID: "asc"}]
# No stored field per hit, not even `_id`: a hit is read from its doc values alone.
# Reading `_id` decompresses the hit's stored-fields block (which holds `_source`) in the
# fetch phase: at 20k documents, 201 hits, OpenSearch's `took` p50 was 23 ms with it and
# 9 ms without (session 15, interleaved, loaded machine).
_NO_STORED_FIELDS = "_none_"
# Only what is read back: a smaller response to send and to parse.
_FILTER_PATH = (
    "took,hits.hits._score,hits.hits.fields,hits.hits.sort,"
    "_shards.total,_shards.failed,_shards.failures.shard,_shards.failures.index,"
    "_shards.failures.reason.type"
)
# Copy keys of the evidence check: `s{shard}@{node}` (a copy not on a node:
# `s{shard}@unassigned-{copy}`).
_COPY_KEY = re.compile(r"^s(\d+)@(.+)$")
_UNASSIGNED = "unassigned-"

# What the eligibility gate knows of a generation's copies: key -> eligible (None: no
# per-copy verdict).
CopyVerdicts = Callable[[str], Mapping[str, bool] | None]
SearchType = Literal["dfs_query_then_fetch", "query_then_fetch"]
DEFAULT_SEARCH_TYPE: SearchType = "dfs_query_then_fetch"
# Shard numbers in OpenSearch's "missing shards [[index][2], …]" refusals.
_MISSING_SHARD = re.compile(r"\]\[(\d+)\]")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Lucene counts every leaf clause of a query against `indices.query.bool.max_clause_count`
# (1 024 by default): one per distinct query word and text field. Text with more distinct
# words is cut to this many (in order) when the engine refuses the whole of it.
_FALLBACK_WORDS = 300
_WORD = re.compile(r"[^\W_]+")
# `QueryPlan.engine_ms` keys: a search call's wall time in the worker (client library,
# network and engine) and the engine's own `took` for it.
ENGINE_SEARCH = "opensearch_search"
ENGINE_TOOK = "opensearch_took"


class OpenSearchLexicalSearch:
    """`LexicalSearch` over the OpenSearch index `{index_prefix}-{generation_id}`.

    Guarantees, beyond the port's:
    - Query text is analyzed like the indexed text (the index's own query analyzer) and
      matched as `most_fields` over the text fields boosted as `field_boosts` says
      (default `DEFAULT_FIELD_BOOSTS`: `title^TITLE_BOOST`, `body`, `tags`) with
      `operator: or`: the score is the sum of the per-field BM25 scores, as in tantivy;
      repeated words count once. On an index without the combined `text` field
      (analyzer version 1, named in its mapping's `_meta`, read once per index), a
      `text` boost applies to title, body and tags instead. Text with no searchable
      token matches nothing; blank text means "filter only" (score 0.0, ordered by
      `document_id`).
    - Every filter is a non-scoring `bool.filter` clause, so a document's score is the same
      with and without them. Filter values that are not valid Unicode match nothing.
    - Order is score descending, then `document_id` ascending, and ties at the `limit`
      boundary are exact: up to 10 000 hits the engine ranks by score alone (so it can
      skip documents that cannot make the top) and every hit tied at the boundary is
      fetched and ordered here; beyond, the engine sorts and pages (`search_after`).
      Responses carry only the fields read (`filter_path`).
    - Text with so many distinct words that the engine refuses the query (more than
      `max_clause_count` clauses) is retried with its first 300 distinct words.
    - A sharded index answers what one shard would: every search is
      `dfs_query_then_fetch` (term and field statistics gathered from every shard first,
      so BM25 scores are global; OpenSearch skips the extra round trip on one shard) with
      `allow_partial_search_results=false`. A shard with no copy that answers fails the
      search with `OrreryError(COVERAGE_UNAVAILABLE)` whose `details.shard` names it —
      never fewer results. `search_type="query_then_fetch"` (shard-local statistics) is
      for diagnosis only: a qualification receipt catches it.
    - An unknown generation raises `OrreryError(COVERAGE_UNAVAILABLE)`; an unreachable or
      overloaded engine `DependencyUnavailable("opensearch", ...)`.
    - No I/O at construction; the client uses a 10 s timeout and retries twice.
    """

    def __init__(
        self,
        client_url: str,
        *,
        index_prefix: str = DEFAULT_INDEX_PREFIX,
        search_type: SearchType = DEFAULT_SEARCH_TYPE,
    ) -> None:
        if not _INDEX_PREFIX.fullmatch(index_prefix):
            raise ValueError(f"index prefix must match {_INDEX_PREFIX.pattern}: {index_prefix!r}")
        if search_type not in ("dfs_query_then_fetch", "query_then_fetch"):
            raise ValueError(f"unknown search type {search_type!r}")
        self.search_type: SearchType = search_type
        self._prefix = index_prefix
        # The index-side text analyzer of an index, by index name (fixed for an index's
        # life; looked up for phrases and when a query boosts the combined `text` field).
        self._analyzers: dict[str, str] = {}
        self._client = OpenSearch(
            hosts=[client_url],
            timeout=REQUEST_TIMEOUT_S,
            max_retries=MAX_RETRIES,
            retry_on_timeout=True,
        )
        self._copy_verdicts: CopyVerdicts = lambda _generation_id: None

    def use_copy_verdicts(self, verdicts: CopyVerdicts) -> None:
        """Take per-copy eligibility from `verdicts` (the eligibility gate's evidence): a
        search then runs only on nodes that hold no ineligible copy
        (`preference=_only_nodes:…`), if those still hold a copy of every shard."""
        self._copy_verdicts = verdicts

    def _preference(self, generation_id: str) -> tuple[str | None, list[dict[str, str]]]:
        """The search preference that bypasses every ineligible copy, and the copies it
        bypasses; a shard left without an eligible copy on those nodes is
        `COVERAGE_UNAVAILABLE` naming it."""
        verdicts = self._copy_verdicts(generation_id)
        if not verdicts:
            return None, []
        copies: list[tuple[int, str, str, bool]] = []
        for key, eligible in verdicts.items():
            match = _COPY_KEY.fullmatch(key)
            if match is not None:
                copies.append((int(match.group(1)), match.group(2), key, eligible))
        bad = {node for _, node, _, ok in copies if not ok and not node.startswith(_UNASSIGNED)}
        if not bad and all(ok for *_, ok in copies):
            return None, []
        good = {n for _, n, _, _ in copies if not n.startswith(_UNASSIGNED)} - bad
        bypassed = [
            {
                "copy": key,
                "reason": "ineligible: its read-back did not match the registry"
                if not ok
                else f"on node {node}, which holds an ineligible copy",
            }
            for _, node, key, ok in sorted(copies)
            if not ok or node in bad
        ]
        for shard in sorted({s for s, *_ in copies}):
            if not any(s == shard and ok and n in good for s, n, _, ok in copies):
                raise OrreryError(
                    ErrorCode.COVERAGE_UNAVAILABLE,
                    f"shard {shard} of generation {generation_id!r} has no eligible copy",
                    {
                        "engine": _ENGINE,
                        "generation_id": generation_id,
                        "shard": shard,
                        "copies": {b["copy"]: b["reason"] for b in bypassed},
                    },
                )
        return ("_only_nodes:" + ",".join(sorted(good)) if bad else None), bypassed

    def search(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        limit: int,
        *,
        field_boosts: Mapping[str, float] | None = None,
    ) -> list[Candidate]:
        fields = _fields(field_boosts)
        if limit <= 0 or filter.matches_nothing():
            return []
        hits, scored = self._run(generation_id, query_text, filter, limit, fields, field_boosts)
        return [_candidate(hit, scored) for hit in hits]

    def scores(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        *,
        field_boosts: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """`LexicalSearch.scores`: the query `search` sends, with only `document_id` as
        a doc-value field."""
        fields = _fields(field_boosts)
        size = id_lookup_size(filter, _ENGINE)
        if size == 0 or filter.matches_nothing():
            return {}
        hits, scored = self._run(
            generation_id, query_text, filter, size, fields, field_boosts, [DOCUMENT_ID], False
        )
        return {_document_id(hit): _score(hit, scored) for hit in hits}

    def _run(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        limit: int,
        fields: list[str],
        field_boosts: Mapping[str, float] | None,
        docvalue_fields: list[str] = _DOCVALUE_FIELDS,
        ordered: bool = True,
    ) -> tuple[list[Any], bool]:
        """The hits of `search`'s query (best first; in any order when not `ordered`)
        and whether they carry scores."""
        if not _GENERATION_ID.fullmatch(generation_id):
            raise _unknown(generation_id)  # No index can have this name.
        index = f"{self._prefix}-{generation_id}"
        combined = _names_combined_field(fields)
        if combined and query_text.strip() and not self._has_combined_field(index, generation_id):
            fields = _fields(field_boosts, combined_field=False)
        clauses = _filter_clauses(filter)
        if filter.phrases:
            analyzer = self._text_analyzer(index, generation_id)
            clauses.extend(_any_phrase(group, analyzer) for group in filter.phrases)
        if not query_text.strip():
            query: dict[str, Any] = {"bool": {"filter": clauses, "must_not": [_HIDDEN]}}
            sort: list[Any] = [{DOCUMENT_ID: "asc"}]
            return self._hits(index, generation_id, query, sort, limit, docvalue_fields), False
        # Lone surrogates (stdlib `json` lets "\ud800" through) become separators.
        text = query_text.encode("utf-8", "replace").decode("utf-8")
        if not fields:
            return [], True
        try:
            query = _text_query(text, clauses, fields)
            return self._scored(index, generation_id, query, limit, docvalue_fields, ordered), True
        except _TooManyClauses:
            pass
        words = list(dict.fromkeys(word.lower() for word in _WORD.findall(text)))
        shorter = " ".join(words[:_FALLBACK_WORDS])
        try:
            query = _text_query(shorter, clauses, fields)
            return self._scored(index, generation_id, query, limit, docvalue_fields, ordered), True
        except _TooManyClauses as exc:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                "query text has too many distinct words",
                {"engine": _ENGINE, "generation_id": generation_id},
            ) from exc

    def close(self) -> None:
        """Close the client's connections. The object is not used afterwards."""
        self._client.close()

    def _has_combined_field(self, index: str, generation_id: str) -> bool:
        """Whether `index` was made with an analyzer that writes the `text` field."""
        analyzer = self._text_analyzer(index, generation_id)
        try:
            return has_combined_field(analyzer)
        except ValueError as exc:
            raise OrreryError(
                ErrorCode.INTERNAL,
                f"generation {generation_id!r} names an unknown text analyzer",
                {"engine": _ENGINE, "text_analyzer": analyzer},
            ) from exc

    def _text_analyzer(self, index: str, generation_id: str) -> str:
        """The analyzer `index` analyzes its text fields with (its mapping's `_meta`,
        read once per index: an index's analyzer never changes)."""
        name = self._analyzers.get(index)
        if name is None:
            try:
                mapping = self._client.indices.get_mapping(index=index)
            except OpenSearchConnectionError as exc:
                raise _unavailable(exc, generation_id) from exc
            except TransportError as exc:
                if exc.error == "index_not_found_exception":
                    raise _unknown(generation_id) from exc
                raise _unavailable(exc, generation_id) from exc
            meta = next(iter(mapping.values()))["mappings"].get("_meta", {})
            name = self._analyzers[index] = str(
                meta.get("orrery", {}).get("text_analyzer", TEXT_ANALYZER_V1)
            )
        return name

    def _hits(
        self,
        index: str,
        generation_id: str,
        query: dict[str, Any],
        sort: list[Any],
        limit: int,
        docvalue_fields: list[str],
    ) -> list[Any]:
        found: list[Any] = []
        search_after: list[Any] | None = None
        while len(found) < limit:
            size = min(limit - len(found), _MAX_PAGE)
            body: dict[str, Any] = {
                "size": size,
                "query": query,
                "sort": sort,
                "track_total_hits": False,
                "_source": False,
                "stored_fields": _NO_STORED_FIELDS,
                "docvalue_fields": docvalue_fields,
            }
            if search_after is not None:
                body["search_after"] = search_after
            hits = self._search(index, generation_id, body)
            found.extend(hits)
            if len(hits) < size:
                break
            search_after = hits[-1]["sort"]
        return found

    def _scored(
        self,
        index: str,
        generation_id: str,
        query: dict[str, Any],
        limit: int,
        docvalue_fields: list[str],
        ordered: bool,
    ) -> list[Any]:
        """The best `limit` hits of a scoring query, by score descending, then
        `document_id` ascending (any order when not `ordered`).

        The engine ranks by score alone (no `sort`: with a sort on `_score` and
        `document_id` its own query time was 2-3x longer at 100k documents), breaking
        ties by its internal order; so extra hits are fetched (a quarter of `limit` more,
        plus one) and, while the last one ties with the `limit`-th, the fetch doubles:
        every document tied at the boundary is then in hand and the `document_id`
        tie-break is exact, whatever the first fetch was. Beyond one page (10 000 hits)
        the engine's sort and `search_after` paging do it instead.
        """
        if not ordered and limit <= _MAX_PAGE:
            return self._search(index, generation_id, _body(query, limit, docvalue_fields))
        fetch = min(limit + 1 + limit // _TIE_SLACK, max(limit + 1, _MAX_PAGE))
        while fetch <= _MAX_PAGE:
            hits = self._search(index, generation_id, _body(query, fetch, docvalue_fields))
            if len(hits) < fetch or _score(hits[-1], True) != _score(hits[limit - 1], True):
                hits.sort(key=lambda hit: (-_score(hit, True), _document_id(hit)))
                return hits[:limit]
            fetch *= 2
        return self._hits(index, generation_id, query, _SCORE_SORT, limit, docvalue_fields)

    def _search(self, index: str, generation_id: str, body: dict[str, Any]) -> list[Any]:
        preference, bypassed = self._preference(generation_id)
        params = {} if preference is None else {"preference": preference}
        try:
            with engine_call(ENGINE_SEARCH):
                response = self._client.search(
                    index=index,
                    body=body,
                    filter_path=_FILTER_PATH,
                    search_type=self.search_type,
                    allow_partial_search_results="false",
                    params=params,
                )
        except OpenSearchConnectionError as exc:
            raise _unavailable(exc, generation_id) from exc
        except TransportError as exc:
            if exc.error == "index_not_found_exception":
                raise _unknown(generation_id) from exc
            if _is_too_many_clauses(exc):
                raise _TooManyClauses from exc
            shard = _failed_shard(exc)
            if shard is not None:
                raise _shard_unavailable(generation_id, shard, str(exc.error)) from exc
            status = exc.status_code
            if not isinstance(status, int) or status in (401, 403, 429) or status >= 500:
                raise _unavailable(exc, generation_id) from exc
            raise OrreryError(
                ErrorCode.INTERNAL,
                f"search failed: {exc}",
                {"engine": _ENGINE, "generation_id": generation_id},
            ) from exc
        except OpenSearchException as exc:
            raise OrreryError(
                ErrorCode.INTERNAL,
                f"search failed: {exc}",
                {"engine": _ENGINE, "generation_id": generation_id},
            ) from exc
        took = response.get("took")
        if isinstance(took, int | float):
            engine_reported(ENGINE_TOOK, float(took))
        shards = response.get("_shards") or {}
        if shards.get("failed"):
            # Not expected with `allow_partial_search_results=false`; never answer short.
            failure = (shards.get("failures") or [{}])[0]
            raise _shard_unavailable(
                generation_id,
                failure.get("shard", -1),
                str((failure.get("reason") or {}).get("type", "shard failed")),
            )
        if int(shards.get("total", 1)) > 1 or bypassed:
            report_shards(
                "lexical",
                {
                    "shards": int(shards.get("total", 1)),
                    "cap": int(body.get("size", 0)),
                    "search_type": self.search_type,
                    "preference": preference,
                    "bypassed": bypassed,
                },
            )
        # `filter_path` leaves out what it filtered to nothing: no hits, no `hits` key.
        hits: list[Any] = response.get("hits", {}).get("hits", [])
        return hits


def _body(query: dict[str, Any], size: int, docvalue_fields: list[str]) -> dict[str, Any]:
    """A one-page request ranked by the engine's score (ties in its internal order)."""
    return {
        "size": size,
        "query": query,
        "track_total_hits": False,
        "_source": False,
        "stored_fields": _NO_STORED_FIELDS,
        "docvalue_fields": docvalue_fields,
    }


class _TooManyClauses(Exception):
    """The engine refused a query for its number of clauses."""


def _fields(overrides: Mapping[str, float] | None, *, combined_field: bool = True) -> list[str]:
    """`multi_match` fields with their boosts (`name^boost`; fields boosted 0 left out)."""
    try:
        boosts = field_boosts(overrides, combined_field=combined_field)
    except ValueError as exc:
        raise OrreryError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
    return [name if boost == 1.0 else f"{name}^{boost}" for name, boost in boosts.items()]


def _names_combined_field(fields: list[str]) -> bool:
    return any(field.split("^", 1)[0] == TEXT for field in fields)


def _text_query(text: str, clauses: list[dict[str, Any]], fields: list[str]) -> dict[str, Any]:
    match = {
        "multi_match": {
            "query": text,
            "fields": fields,
            "type": "most_fields",
            "operator": "or",
            "zero_terms_query": "none",
        }
    }
    return {"bool": {"must": [match], "filter": clauses, "must_not": [_HIDDEN]}}


# Documents hidden from the lexical lane (`Record.index_lanes`) are never a hit.
_HIDDEN = {"term": {FACETS: hidden_term("lexical")}}


def _filter_clauses(filter: SearchFilter) -> list[dict[str, Any]]:
    """One non-scoring clause per restriction; all must hold."""
    clauses: list[dict[str, Any]] = []
    if filter.galaxy is not None:
        clauses.append(_any_of(GALAXY, (filter.galaxy,)))
    if filter.status is not None:
        clauses.append(_any_of(STATUS, filter.status))
    if filter.visibility is not None:
        clauses.append(_any_of(VISIBILITY, filter.visibility))
    if filter.updated_after is not None or filter.updated_before is not None:
        # On integer microseconds: the date field is indexed at millisecond precision.
        bounds: dict[str, int] = {}
        if filter.updated_after is not None:
            bounds["gte"] = _epoch_micros(filter.updated_after)
        if filter.updated_before is not None:
            bounds["lte"] = _epoch_micros(filter.updated_before)
        clauses.append({"range": {UPDATED_AT_MICROS: bounds}})
    for name, values in sorted(filter.facets.items()):
        clauses.append(_any_of(FACETS, [f"{name}{FACET_SEPARATOR}{value}" for value in values]))
    if filter.document_ids is not None:
        clauses.append(_any_of(DOCUMENT_ID, filter.document_ids))
    if filter.rings is not None:
        clauses.append(_any_of(RING, filter.rings))
    if filter.ring_trees is not None:
        clauses.append(_any_of(RING_PATH, filter.ring_trees))
    return clauses


def _any_phrase(phrases: Sequence[str], analyzer: str) -> dict[str, Any]:
    """Matches documents where one of `phrases` occurs in a source text field: its tokens
    adjacent and in order (`match_phrase`, slop 0).

    Phrases are analyzed with the index-side `analyzer`, not the mapping's search
    analyzer: that one drops repeated words, which would shift the positions of the
    words after them. A phrase without tokens matches nothing (`zero_terms_query`).
    """
    should = [
        {
            "match_phrase": {
                field: {
                    # Lone surrogates (stdlib `json` lets "\ud800" through) become separators.
                    "query": phrase.encode("utf-8", "replace").decode("utf-8"),
                    "analyzer": analyzer,
                    "slop": 0,
                    "zero_terms_query": "none",
                }
            }
        }
        for phrase in dict.fromkeys(phrases)
        for field in SOURCE_TEXT_FIELDS
    ]
    if not should:
        return {"match_none": {}}
    return {"bool": {"should": should, "minimum_should_match": 1}}


def _any_of(field: str, values: Sequence[str]) -> dict[str, Any]:
    """Matches documents holding at least one of `values` in `field`.

    A value that is not valid Unicode (a lone surrogate) is never stored: it matches nothing.
    """
    unique = [value for value in dict.fromkeys(values) if is_unicode(value)]
    if not unique:
        return {"match_none": {}}
    if len(unique) == 1:
        return {"term": {field: unique[0]}}
    if len(unique) <= _MAX_TERMS:
        return {"terms": {field: unique}}
    parts = [
        {"terms": {field: unique[start : start + _MAX_TERMS]}}
        for start in range(0, len(unique), _MAX_TERMS)
    ]
    return {"bool": {"should": parts, "minimum_should_match": 1}}


def _epoch_micros(value: datetime) -> int:
    """Microseconds since the Unix epoch; a naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _MICROSECOND


def _score(hit: dict[str, Any], scored: bool) -> float:
    return float(hit["_score"]) if scored and hit.get("_score") is not None else 0.0


def _document_id(hit: dict[str, Any]) -> str:
    try:
        return str(hit["fields"][DOCUMENT_ID][0])
    except (KeyError, IndexError, TypeError) as exc:
        raise OrreryError(
            ErrorCode.INTERNAL,
            "index document lacks its document_id",
            {"engine": _ENGINE},
        ) from exc


def _candidate(hit: dict[str, Any], scored: bool) -> Candidate:
    fields = hit.get("fields") or {}
    try:
        document_id = fields[DOCUMENT_ID][0]
        revision = fields[REVISION][0]
        micros = fields[UPDATED_AT_MICROS][0]
        status = fields[STATUS][0]
    except (KeyError, IndexError) as exc:
        raise OrreryError(
            ErrorCode.INTERNAL,
            "index document lacks a field a candidate needs",
            {"engine": _ENGINE, "fields": sorted(fields)},
        ) from exc
    score = _score(hit, scored)
    return Candidate(
        document_id=str(document_id),
        revision=int(revision),
        score=score,
        updated_at=_EPOCH + int(micros) * _MICROSECOND,
        status=str(status),
    )


def _is_too_many_clauses(exc: TransportError) -> bool:
    """Lucene's `TooManyClauses` (or `TooManyNestedClauses`), reported as a 400 or a 500
    `search_phase_execution_exception` depending on where the query was rewritten."""
    info = str(exc.info)
    return "too_many_clauses" in info or "too_many_nested_clauses" in info


def _failed_shard(exc: TransportError) -> int | None:
    """The shard a search failed on because no copy of it answered (None: the failure
    is not about a shard). OpenSearch refuses such a search with "missing shards
    [[index][n]]" before it starts, or with a `search_phase_execution_exception` listing
    `failed_shards` when a copy failed during it."""
    info = exc.info if isinstance(exc.info, dict) else {}
    error = info.get("error") if isinstance(info.get("error"), dict) else {}
    failed = error.get("failed_shards") if isinstance(error, dict) else None
    if isinstance(failed, list) and failed and isinstance(failed[0], dict):
        shard = failed[0].get("shard")
        if isinstance(shard, int):
            return shard
    text = str(exc.info)
    if "missing shards" in text or "partial shards failure" in text.lower():
        found = _MISSING_SHARD.search(text)
        return int(found.group(1)) if found else -1
    return None


def _shard_unavailable(generation_id: str, shard: int, reason: str) -> OrreryError:
    return OrreryError(
        ErrorCode.COVERAGE_UNAVAILABLE,
        f"shard {shard} of generation {generation_id!r} has no copy that answers ({reason}): "
        "no partial answer is given",
        {"engine": _ENGINE, "generation_id": generation_id, "shard": shard, "reason": reason},
    )


def _unknown(generation_id: str) -> OrreryError:
    return OrreryError(
        ErrorCode.COVERAGE_UNAVAILABLE,
        f"no lexical index for generation {generation_id!r}",
        {"engine": _ENGINE, "generation_id": generation_id},
    )


def _unavailable(exc: OpenSearchException, generation_id: str) -> DependencyUnavailable:
    return DependencyUnavailable(_ENGINE, f"search failed: {exc}", {"generation_id": generation_id})
