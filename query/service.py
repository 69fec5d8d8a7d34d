"""Use cases of the query worker: the one-shot top-k and the generic retrieve."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from contracts.digests import sha256_hex, sha256_json
from contracts.embedding import Embedder
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import Candidate, SearchFilter
from contracts.topk import (
    MAX_ALLOWED_DOC_IDS,
    CandidateOut,
    LatencyMs,
    QueryFilters,
    QueryPlan,
    Ranking,
    RetrieveRequest,
    RetrieveResponse,
    ScoreBreakdown,
    TopKRequest,
    TopKResponse,
    TopKResult,
)
from query.model import PROFILE_ID, FusedCandidate, fuse_weighted, resolve_scope_ref
from query.ports import Cache, LexicalSearch, RecordReader, Route, Routing, VectorSearch

__all__ = ["Principal", "QueryEmbeddingCache", "QueryLimits", "QueryPorts", "topk_records"]

log = logging.getLogger("orrery.query")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: the namespace and galaxy an API key reaches (None = any)."""

    namespace: str | None = None
    galaxy: str | None = None


@dataclass(frozen=True, slots=True)
class QueryLimits:
    max_result_limit: int = 100
    candidate_depth: int = 100
    freshness_half_life_days: float = 30.0
    response_ttl_seconds: float = 300.0
    embedding_ttl_seconds: float = 86_400.0


class QueryEmbeddingCache:
    """Query vectors by `(embedder_id, text)`: a bounded in-process LRU in front of an
    optional shared cache (Redis in server mode). Thread-safe; a shared-cache failure
    only costs an embedding."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        capacity: int = 4_096,
        shared: Cache | None = None,
        ttl_seconds: float = 86_400.0,
    ) -> None:
        self._embedder = embedder
        self._capacity = capacity
        self._shared = shared
        self._ttl = ttl_seconds
        self._items: OrderedDict[str, tuple[float, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def embedder_id(self) -> str:
        return self._embedder.embedder_id

    def vector(self, text: str) -> tuple[float, ...]:
        with self._lock:
            hit = self._items.get(text)
            if hit is not None:
                self._items.move_to_end(text)
                return hit
        key = f"qv:{self.embedder_id}:{sha256_hex(text.encode())}"
        vector = self._shared_get(key)
        if vector is None:
            vector = self._embedder.embed([text])[0]
            self._shared_set(key, vector)
        with self._lock:
            self._items[text] = vector
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return vector

    def _shared_get(self, key: str) -> tuple[float, ...] | None:
        if self._shared is None:
            return None
        try:
            raw = self._shared.get(key)
        except DependencyUnavailable as exc:
            log.debug("query-vector cache unavailable: %s", exc.message)
            return None
        return None if raw is None else tuple(json.loads(raw))

    def _shared_set(self, key: str, vector: tuple[float, ...]) -> None:
        if self._shared is None:
            return
        try:
            self._shared.set(key, json.dumps(vector).encode(), self._ttl)
        except DependencyUnavailable as exc:
            log.debug("query-vector cache unavailable: %s", exc.message)


@dataclass(frozen=True, slots=True)
class QueryPorts:
    routing: Routing
    lexical: LexicalSearch
    vectors: VectorSearch
    records: RecordReader
    query_vectors: QueryEmbeddingCache
    responses: Cache | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))


class _Stopwatch:
    """Stage timings and the deadline shared by all stages of one request."""

    def __init__(self, timeout_seconds: float) -> None:
        self.start = time.perf_counter()
        self.deadline = self.start + timeout_seconds
        self.timeout_seconds = timeout_seconds
        self.stages: dict[str, float] = dict.fromkeys(
            ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize"),
            0.0,
        )
        self._mark = self.start

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] += (now - self._mark) * 1000.0
        self._mark = now
        if now > self.deadline:
            raise OrreryError(
                ErrorCode.DEADLINE_EXCEEDED,
                f"the request exceeded timeout_seconds={self.timeout_seconds} during {stage}",
                {"stage": stage, "latency_ms": self.latency().model_dump()},
            )

    def latency(self) -> LatencyMs:
        total = (time.perf_counter() - self.start) * 1000.0
        return LatencyMs(**{k: round(v, 3) for k, v in self.stages.items()}, total=round(total, 3))


def _authorize(principal: Principal, namespace: str, filters: QueryFilters) -> str | None:
    """Check the namespace and return the galaxy to filter on (the key's, or narrower)."""
    if principal.namespace is not None and principal.namespace != namespace:
        raise OrreryError(
            ErrorCode.FORBIDDEN,
            f"this API key may not read namespace {namespace!r}",
            {"namespace": namespace},
        )
    if principal.galaxy is not None:
        if filters.galaxy is not None and filters.galaxy != principal.galaxy:
            raise OrreryError(
                ErrorCode.FORBIDDEN,
                f"this API key is limited to galaxy {principal.galaxy!r}",
                {"galaxy": filters.galaxy},
            )
        return principal.galaxy
    return filters.galaxy


def _search_filter(
    filters: QueryFilters, galaxy: str | None, document_ids: Sequence[str] | None
) -> SearchFilter:
    return SearchFilter(
        galaxy=galaxy,
        status=None if filters.status is None else tuple(filters.status),
        visibility=None if filters.visibility is None else tuple(filters.visibility),
        updated_after=filters.updated_after,
        updated_before=filters.updated_before,
        facets={k: tuple(v) for k, v in filters.facets.items()},
        document_ids=None if document_ids is None else tuple(document_ids),
    )


@dataclass(slots=True)
class _Ranked:
    route: Route
    fused: list[FusedCandidate]
    candidate_count: int
    indexes_used: list[str]
    watch: _Stopwatch
    cached: bool = False


def _rank(
    *,
    principal: Principal,
    namespace: str,
    scope_ref: str,
    query_text: str,
    filters: QueryFilters,
    ranking: Ranking,
    limit: int,
    allowed_doc_ids: Sequence[str] | None,
    timeout_seconds: float,
    ports: QueryPorts,
    limits: QueryLimits,
    cache_probe: Callable[[Route, _Stopwatch], bool] | None = None,
) -> _Ranked:
    watch = _Stopwatch(timeout_seconds)
    if limit > limits.max_result_limit:
        raise OrreryError(
            ErrorCode.RESULT_LIMIT_EXCEEDED,
            f"result_limit may be at most {limits.max_result_limit}, got {limit}",
            {"max_result_limit": limits.max_result_limit},
        )
    text = query_text.strip()
    if not text and filters.is_empty() and allowed_doc_ids is None:
        raise OrreryError(
            ErrorCode.EMPTY_QUERY, "query_text is empty and no filter narrows the scope"
        )
    galaxy = _authorize(principal, namespace, filters)
    kind = resolve_scope_ref(scope_ref)
    route = ports.routing.route(namespace, kind)
    if route is None:
        raise OrreryError(
            ErrorCode.SCOPE_NOT_READY,
            f"scope {scope_ref!r} of namespace {namespace!r} has no live generation yet",
            {"scope_ref": scope_ref, "namespace": namespace},
        )
    if route.embedder_id != ports.query_vectors.embedder_id:
        raise OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"generation {route.generation_id} was built with {route.embedder_id}, this "
            f"worker embeds with {ports.query_vectors.embedder_id}",
        )
    search_filter = _search_filter(filters, galaxy, allowed_doc_ids)
    depth = max(limits.candidate_depth, limit)
    watch.lap("scope_resolve")
    if cache_probe is not None and cache_probe(route, watch):
        return _Ranked(
            route=route, fused=[], candidate_count=0, indexes_used=[], watch=watch, cached=True
        )

    use_vector = bool(text) and ranking.vector_weight > 0.0
    query_vector = ports.query_vectors.vector(text) if use_vector else None
    watch.lap("candidate_fetch")

    indexes_used: list[str] = []
    lexical: list[Candidate] = []
    vector: list[Candidate] = []
    if ranking.lexical_weight > 0.0 or not use_vector:
        lexical = ports.lexical.search(route.generation_id, text, search_filter, depth)
        indexes_used.append("bm25" if text else "filter")
    if query_vector is not None:
        vector = ports.vectors.search(route.generation_id, query_vector, search_filter, depth)
        indexes_used.append("vector")
    if search_filter != SearchFilter() or ranking.metadata_weight > 0.0:
        indexes_used.append("metadata")
    watch.lap("index_search")

    fused = fuse_weighted(
        lexical,
        vector,
        ranking=ranking,
        now=ports.clock(),
        half_life_days=limits.freshness_half_life_days,
    )
    watch.lap("rerank")
    return _Ranked(
        route=route,
        fused=fused,
        candidate_count=len(fused),
        indexes_used=indexes_used,
        watch=watch,
    )


def _plan(ranked: _Ranked, mode: str, depth: int, cache: str = "disabled") -> QueryPlan:
    return QueryPlan(
        candidate_scope_mode="allowed_doc_ids" if mode == "allowed_doc_ids" else "scope_ref",
        candidate_count=ranked.candidate_count,
        indexes_used=ranked.indexes_used,
        reranked_count=len(ranked.fused),
        latency_ms=ranked.watch.latency(),
        generation_id=ranked.route.generation_id,
        applied_position=ranked.route.applied_position,
        profile=PROFILE_ID,
        cache=cache,
        candidate_depth=depth,
    )


def _response_key(request: TopKRequest, principal: Principal, route: Route) -> str:
    """Everything a response depends on: the generation and the writes it reflects
    (`commit_seq` counts its committed batches, so it moves even when partitions
    deliver positions out of order),
    the caller's reach, and the normalized request (minus what does not change results)."""
    normalized = request.model_dump(mode="json", exclude={"client_request_id", "timeout_seconds"})
    return "topk:" + sha256_json(
        {
            "generation_id": route.generation_id,
            "applied_position": route.applied_position,
            "commit_seq": route.commit_seq,
            "principal": [principal.namespace, principal.galaxy],
            "request": normalized,
        }
    )


def topk_records(
    request: TopKRequest, *, principal: Principal, ports: QueryPorts, limits: QueryLimits
) -> TopKResponse:
    """One round trip: resolve the scope, search both indexes with filters before
    scoring, fuse, take the top k, and materialize their payloads (top k only) from the
    canonical store at exactly the revisions the generation ranked.

    Whole responses are cached under a key that binds the generation id and applied log
    position, so a write or a promote can never be answered from a stale entry.
    """
    cache_state = "disabled" if ports.responses is None else "miss"
    cached: TopKResponse | None = None
    cache_key = ""

    def probe(route: Route, watch: _Stopwatch) -> bool:
        nonlocal cache_state, cached, cache_key
        if ports.responses is None:
            return False
        cache_key = _response_key(request, principal, route)
        try:
            raw = ports.responses.get(cache_key)
        except DependencyUnavailable as exc:
            log.warning("response cache unavailable: %s", exc.message)
            cache_state = "unavailable"
            return False
        if raw is None:
            return False
        cached = TopKResponse.model_validate_json(raw)
        cache_state = "hit"
        return True

    ranked = _rank(
        principal=principal,
        namespace=request.namespace,
        scope_ref=request.scope_ref,
        query_text=request.query_text,
        filters=request.filters,
        ranking=request.ranking,
        limit=request.result_limit,
        allowed_doc_ids=None,
        timeout_seconds=request.timeout_seconds,
        ports=ports,
        limits=limits,
        cache_probe=probe,
    )
    depth = max(limits.candidate_depth, request.result_limit)
    if cached is not None:
        plan = None
        if cached.query_plan is not None:
            plan = cached.query_plan.model_copy(
                update={"latency_ms": ranked.watch.latency(), "cache": "hit"}
            )
        return cached.model_copy(
            update={"client_request_id": request.client_request_id, "query_plan": plan}
        )
    top = ranked.fused[: request.result_limit]
    stored = ports.records.fetch([(c.document_id, c.revision) for c in top])
    results: list[TopKResult] = []
    for rank, candidate in enumerate(top, start=1):
        row = stored.get((candidate.document_id, candidate.revision))
        if row is None:
            raise OrreryError(
                ErrorCode.COVERAGE_UNAVAILABLE,
                f"document {candidate.document_id} revision {candidate.revision} is "
                "indexed but missing from the record store",
                {"generation_id": ranked.route.generation_id},
            )
        record: dict[str, Any] = json.loads(row.record_json)
        metadata = dict(record["metadata"])
        metadata.update(
            snapshot_kind=row.snapshot_kind,
            galaxy=row.galaxy,
            ring=record.get("ring", ""),
            revision=row.revision,
            payload_sha256=row.payload_sha256,
        )
        results.append(
            TopKResult(
                rank=rank,
                document_id=candidate.document_id,
                item_id=row.item_id,
                payload_schema=record.get("payload_schema", ""),
                payload=record["payload"] if request.include.payload else None,
                metadata=metadata if request.include.metadata else None,
                content=record["text"] if request.include.content else None,
                score=round(candidate.score, 6),
                score_breakdown=_breakdown(candidate) if request.include.score_breakdown else None,
            )
        )
    ranked.watch.lap("payload_materialize")
    response = TopKResponse(
        scope_ref=request.scope_ref,
        generation_id=ranked.route.generation_id,
        profile=PROFILE_ID,
        client_request_id=request.client_request_id,
        results=results,
        query_plan=_plan(ranked, "scope_ref", depth, cache_state)
        if request.include.query_plan
        else None,
    )
    if ports.responses is not None and cache_state == "miss":
        try:
            ports.responses.set(
                cache_key, response.model_dump_json().encode(), limits.response_ttl_seconds
            )
        except DependencyUnavailable as exc:
            log.warning("response cache unavailable: %s", exc.message)
    return response


def retrieve(
    request: RetrieveRequest, *, principal: Principal, ports: QueryPorts, limits: QueryLimits
) -> RetrieveResponse:
    """The generic API: ranked candidates (ids, revisions, scores), no payloads."""
    if request.allowed_doc_ids is not None and len(request.allowed_doc_ids) > MAX_ALLOWED_DOC_IDS:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "too many allowed_doc_ids")
    ranked = _rank(
        principal=principal,
        namespace=request.namespace,
        scope_ref=request.scope_ref,
        query_text=request.query_text,
        filters=request.filters,
        ranking=request.ranking,
        limit=request.limit,
        allowed_doc_ids=request.allowed_doc_ids,
        timeout_seconds=request.timeout_seconds,
        ports=ports,
        limits=limits,
    )
    top = ranked.fused[: request.limit]
    mode = "allowed_doc_ids" if request.allowed_doc_ids is not None else "scope_ref"
    return RetrieveResponse(
        scope_ref=request.scope_ref,
        generation_id=ranked.route.generation_id,
        profile=PROFILE_ID,
        candidates=[
            CandidateOut(
                rank=rank,
                document_id=c.document_id,
                revision=c.revision,
                score=round(c.score, 6),
                score_breakdown=_breakdown(c),
            )
            for rank, c in enumerate(top, start=1)
        ],
        query_plan=_plan(ranked, mode, max(limits.candidate_depth, request.limit)),
    )


def _breakdown(candidate: FusedCandidate) -> ScoreBreakdown:
    return ScoreBreakdown(
        lexical=round(candidate.lexical, 6),
        vector=round(candidate.vector, 6),
        freshness=round(candidate.freshness, 6),
        metadata=round(candidate.metadata, 6),
    )
