"""Nearest-neighbour search over the qdrant-edge shards the projector writes.

qdrant-edge allows one process per shard directory, so this adapter does not open
shards: it is given `shard_provider` (in the embedded deployment,
`QdrantEdgeVectorIndex.shard_for` of the projector's index in the same process), which
returns the open shard of a generation or raises `KeyError` for an unknown one.

The payload it reads and filters on is written by
`projector.adapters.qdrant_edge_vectors` as `contracts.vector_payload` lays it out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from qdrant_edge import (
    EdgeShard,
    FieldCondition,
    Filter,
    HasIdCondition,
    MatchAny,
    MatchValue,
    PayloadSelector,
    Query,
    QueryRequest,
    RangeDateTime,
    ScoredPoint,
    SearchParams,
)

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import Candidate, SearchFilter, id_lookup_size
from contracts.index_fields import (
    DOCUMENT_ID,
    FACETS,
    GALAXY,
    RING,
    RING_PATH,
    STATUS,
    UPDATED_AT,
    VISIBILITY,
    hidden_term,
)
from contracts.timing import engine_call
from contracts.vector_payload import (
    RETURNED_FIELDS,
    VECTOR_NAME,
    best_first,
    candidate_of,
    check_query_vector,
    cosine_score,
    facet_terms,
    point_id,
    utc_timestamp,
)

if TYPE_CHECKING:
    from qdrant_edge import ConditionType

__all__ = ["QdrantEdgeVectorSearch", "ShardProvider", "edge_filter"]

DEPENDENCY = "qdrant-edge"
# The `QueryPlan.engine_ms` key of qdrant-edge's query calls.
ENGINE = "qdrant_edge_query"

# `PayloadSelector.Include` is cheaper than the same list of keys as `with_payload`:
# 0.56 -> 0.47 ms for a top-101 request at 10k (the engine call, payloads converted).
_RETURNED = PayloadSelector.Include(list(RETURNED_FIELDS))

ShardProvider = Callable[[str], EdgeShard]
"""Returns the open shard of a generation; raises `KeyError` if there is none."""


class QdrantEdgeVectorSearch:
    """Cosine nearest neighbours over one generation's qdrant-edge shard.

    Guarantees (those of `query.ports.VectorSearch`):
    - The filter is part of the engine request (payload indexes), never applied
      afterwards, so `limit` results come back whenever that many documents match.
      It restricts and never changes scores. A filter with an empty list returns [].
    - At most `limit` candidates, best first, ties broken by `document_id` ascending
      (also across the `limit` boundary); scores are cosine similarities in [-1, 1].
    - Exact on segments without HNSW (qdrant-edge brute-forces them); on HNSW segments
      approximate with `ef = max(hnsw_ef, limit + 1)`.

    Errors: unknown generation -> `COVERAGE_UNAVAILABLE`; a query vector of the wrong
    dimension -> `EMBEDDER_MISMATCH`; non-finite or zero vector, naive datetime bounds ->
    `INVALID_REQUEST`; any other engine failure -> `DependencyUnavailable`.
    """

    def __init__(self, shard_provider: ShardProvider, *, hnsw_ef: int = 128) -> None:
        self._shard_provider = shard_provider
        self._hnsw_ef = hnsw_ef

    def search(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        limit: int,
    ) -> list[Candidate]:
        query_vector = check_query_vector(vector)
        engine_filter = edge_filter(filter)
        if limit <= 0 or filter.matches_nothing():
            return []
        shard = self._shard(generation_id)
        points = self._top(shard, generation_id, query_vector, engine_filter, limit)
        return best_first((candidate_of(p.payload or {}, p.score) for p in points), limit)

    def scores(
        self, generation_id: str, vector: Sequence[float], filter: SearchFilter
    ) -> dict[str, float]:
        """`VectorSearch.scores`: one exact request (`SearchParams(exact=True)`) over the
        listed documents' points, without payloads. A point's id is a pure function of
        its document's id (`contracts.vector_payload.point_id`), so the ids are matched
        as point ids (`HasIdCondition`: the engine goes to those points directly; a
        `MatchAny` on the `document_id` payload index cost half as much again) and each
        returned point maps back to its document by that id."""
        query_vector = check_query_vector(vector)
        must = _must(filter.model_copy(update={"document_ids": None}))
        size = id_lookup_size(filter, DEPENDENCY)
        if size == 0 or filter.matches_nothing():
            return {}
        # Point id (as a string) -> document id: a document id that is a canonical UUID
        # is its own point id (`point_id`), so no UUID object is built for it.
        documents = {
            _point_key(document_id): document_id for document_id in filter.document_ids or ()
        }
        must.append(HasIdCondition(set(documents)))
        shard = self._shard(generation_id)
        points = self._exact(
            shard, generation_id, query_vector, Filter(must=must, must_not=[_HIDDEN]), size
        )
        return {documents[str(point.id)]: cosine_score(point.score) for point in points}

    def _exact(
        self,
        shard: EdgeShard,
        generation_id: str,
        vector: list[float],
        engine_filter: Filter | None,
        limit: int,
    ) -> list[ScoredPoint]:
        request = QueryRequest(
            limit=limit,
            query=Query.Nearest(vector, using=VECTOR_NAME),
            filter=engine_filter,
            with_payload=False,
            with_vector=False,
            params=SearchParams(exact=True),
        )
        try:
            with engine_call(ENGINE):
                return shard.query(request)
        except Exception as error:  # the driver raises bare Exception
            raise _translate(error, generation_id) from error

    def _shard(self, generation_id: str) -> EdgeShard:
        try:
            return self._shard_provider(generation_id)
        except KeyError:
            raise OrreryError(
                ErrorCode.COVERAGE_UNAVAILABLE,
                f"no vector index for generation {generation_id!r}",
                {"generation_id": generation_id},
            ) from None

    def _top(
        self,
        shard: EdgeShard,
        generation_id: str,
        vector: list[float],
        engine_filter: Filter | None,
        limit: int,
    ) -> list[ScoredPoint]:
        """The best points, including every point tied with the `limit`-th one.

        The engine orders ties arbitrarily, so one extra point is fetched: if it ties
        with the last one kept, the tie group may continue and the fetch doubles.
        """
        fetch = limit + 1
        while True:
            request = QueryRequest(
                limit=fetch,
                query=Query.Nearest(vector, using=VECTOR_NAME),
                filter=engine_filter,
                with_payload=_RETURNED,
                with_vector=False,
                params=SearchParams(hnsw_ef=max(self._hnsw_ef, fetch)),
            )
            try:
                with engine_call(ENGINE):
                    points = shard.query(request)
            except Exception as error:  # the driver raises bare Exception
                raise _translate(error, generation_id) from error
            if len(points) < fetch or points[-1].score != points[limit - 1].score:
                return points
            fetch *= 2


def edge_filter(filter: SearchFilter) -> Filter | None:
    """The engine filter equivalent to `filter`, less the documents hidden from the
    vector lane (never None: that exclusion always applies).

    Every clause is a `must`; any-of lists are `MatchAny` on keyword indexes, facets are
    matched as `"name=value"` strings, time bounds are inclusive datetime ranges in UTC
    (naive bounds are `INVALID_REQUEST`).
    Phrase groups are refused (`INTERNAL`): the query worker resolves them to ids.
    """
    must = _must(filter)
    return Filter(must=must or None, must_not=[_HIDDEN])


def _must(filter: SearchFilter) -> list[ConditionType]:
    """The `must` clauses of `edge_filter` (the same refusals)."""
    if filter.phrases:
        raise OrreryError(
            ErrorCode.INTERNAL,
            "vector search cannot apply phrase filters; resolve them to document_ids first",
            {"engine": "qdrant-edge"},
        )
    must: list[ConditionType] = []
    if filter.galaxy is not None:
        must.append(FieldCondition(GALAXY, match=MatchValue(filter.galaxy)))
    if filter.status is not None:
        must.append(FieldCondition(STATUS, match=MatchAny(list(filter.status))))
    if filter.visibility is not None:
        must.append(FieldCondition(VISIBILITY, match=MatchAny(list(filter.visibility))))
    if filter.updated_after is not None or filter.updated_before is not None:
        must.append(
            FieldCondition(
                UPDATED_AT,
                range=RangeDateTime(
                    gte=_bound(filter.updated_after), lte=_bound(filter.updated_before)
                ),
            )
        )
    for name, values in sorted(filter.facets.items()):
        must.append(FieldCondition(FACETS, match=MatchAny(facet_terms(name, values))))
    if filter.document_ids is not None:
        must.append(FieldCondition(DOCUMENT_ID, match=MatchAny(list(filter.document_ids))))
    if filter.rings is not None:
        must.append(FieldCondition(RING, match=MatchAny(list(filter.rings))))
    if filter.ring_trees is not None:
        must.append(FieldCondition(RING_PATH, match=MatchAny(list(filter.ring_trees))))
    return must


# Documents hidden from the vector lane (`Record.index_lanes`) are never a hit.
_HIDDEN = FieldCondition(FACETS, match=MatchValue(hidden_term("vector")))


# Exactly the strings `str(uuid.UUID(s)) == s` holds for: `point_id` takes those as is.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# Memoized: the weighted re-score maps every candidate's id on each query, and a uuid5 in
# Python costs ~15 µs (a quarter of `scores` at 70 ids); the same documents recur across
# queries. `lru_cache` is C, thread-safe and bounded.
@functools.lru_cache(maxsize=65_536)
def _point_key(document_id: str) -> str:
    """`str(point_id(document_id))`, without parsing a canonical UUID into an object."""
    if _CANONICAL_UUID.fullmatch(document_id):
        return document_id
    return str(point_id(document_id))


def _bound(value: datetime | None) -> str | None:
    return None if value is None else utc_timestamp(value)


def _translate(error: Exception, generation_id: str) -> OrreryError:
    message = str(error)
    if "dimension error" in message:
        return OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"query vector does not fit generation {generation_id!r}: {message}",
            {"generation_id": generation_id},
        )
    if "not initialized" in message:
        # The shard was closed under us: the generation was dropped or the index closed.
        return OrreryError(
            ErrorCode.COVERAGE_UNAVAILABLE,
            f"vector index of generation {generation_id!r} was closed",
            {"generation_id": generation_id},
        )
    return DependencyUnavailable(DEPENDENCY, f"query {generation_id}: {message}")
