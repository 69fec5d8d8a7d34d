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
from contracts.profiles import FusionProfile, RrfProfile, WeightedProfile
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
from query.fusion import FusedCandidate, Rescored, fuse
from query.model import resolve_scope_ref
from query.ports import (
    Cache,
    LexicalSearch,
    RecordReader,
    Route,
    RouteAdmission,
    Routing,
    VectorSearch,
)
from query.profiles import ProfileRegistry

__all__ = ["Principal", "QueryEmbeddingCache", "QueryLimits", "QueryPorts", "topk_records"]

log = logging.getLogger("orrery.query")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: the namespace and galaxy an API key reaches (None = any)."""

    namespace: str | None = None
    galaxy: str | None = None


@dataclass(frozen=True, slots=True)
class QueryLimits:
    """Per-worker query configuration.

    Candidates fetched per source: the profile's depth for that source, else
    `lexical_depth` / `vector_depth`, else `candidate_depth` — and never fewer than the
    request's result limit, nor, for an `rrf` profile, than its `rank_window` (so every
    rank inside the window is known).
    """

    max_result_limit: int = 100
    candidate_depth: int = 100
    freshness_half_life_days: float = 30.0
    response_ttl_seconds: float = 300.0
    embedding_ttl_seconds: float = 86_400.0
    lexical_depth: int | None = None
    vector_depth: int | None = None
    profiles: ProfileRegistry = field(default_factory=ProfileRegistry)

    def depths(self, profile: FusionProfile, limit: int) -> dict[str, int]:
        """Candidates to fetch from each source for `profile` and a result limit."""
        lexical = profile.lexical_depth or self.lexical_depth or self.candidate_depth
        vector = profile.vector_depth or self.vector_depth or self.candidate_depth
        floor = max(limit, profile.rank_window if isinstance(profile, RrfProfile) else 0)
        return {"lexical": max(lexical, floor), "vector": max(vector, floor)}


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
    eligibility: RouteAdmission | None = None


class _Stopwatch:
    """Stage timings and the deadline shared by all stages of one request.

    Every stage ends with `lap`, which raises `DEADLINE_EXCEEDED` once the deadline has
    passed, so no stage starts late and no partial result leaves: the error carries the
    plan so far instead (`details.query_plan`: what `plan` holds, plus `latency_ms`).
    """

    def __init__(self, timeout_seconds: float) -> None:
        self.start = time.perf_counter()
        self.deadline = self.start + timeout_seconds
        self.timeout_seconds = timeout_seconds
        self.stages: dict[str, float] = dict.fromkeys(
            ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize"),
            0.0,
        )
        self.plan: dict[str, Any] = {}
        self._mark = self.start

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] += (now - self._mark) * 1000.0
        self._mark = now
        if now > self.deadline:
            raise OrreryError(
                ErrorCode.DEADLINE_EXCEEDED,
                f"the request exceeded timeout_seconds={self.timeout_seconds} during {stage}",
                {
                    "stage": stage,
                    "timeout_seconds": self.timeout_seconds,
                    "latency_ms": self.latency().model_dump(),
                    "query_plan": {
                        **self.plan,
                        "completed_stages": [s for s, ms in self.stages.items() if ms > 0.0],
                        "latency_ms": self.latency().model_dump(),
                    },
                },
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
    profile: FusionProfile
    depths: dict[str, int]
    fused: list[FusedCandidate]
    candidate_count: int
    indexes_used: list[str]
    watch: _Stopwatch
    source_counts: dict[str, int] = field(default_factory=dict)
    rescored_count: int = 0
    cached: bool = False


def _rank(
    *,
    principal: Principal,
    namespace: str,
    scope_ref: str,
    query_text: str,
    filters: QueryFilters,
    profile_id: str | None,
    ranking: Ranking,
    limit: int,
    allowed_doc_ids: Sequence[str] | None,
    timeout_seconds: float,
    ports: QueryPorts,
    limits: QueryLimits,
    cache_probe: Callable[[Route, FusionProfile, _Stopwatch], bool] | None = None,
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
    profile = limits.profiles.resolve(profile_id, ranking)
    depths = limits.depths(profile, limit)
    watch.plan.update(profile=profile.id, candidate_depths=depths)
    kind = resolve_scope_ref(scope_ref)
    route = ports.routing.route(namespace, kind)
    if route is None:
        raise OrreryError(
            ErrorCode.SCOPE_NOT_READY,
            f"scope {scope_ref!r} of namespace {namespace!r} has no live generation yet",
            {"scope_ref": scope_ref, "namespace": namespace},
        )
    if ports.eligibility is not None:
        route = ports.eligibility.admit(route, scope_ref)
    if route.embedder_id != ports.query_vectors.embedder_id:
        raise OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"generation {route.generation_id} was built with {route.embedder_id}, this "
            f"worker embeds with {ports.query_vectors.embedder_id}",
        )
    search_filter = _search_filter(filters, galaxy, allowed_doc_ids)
    watch.plan.update(generation_id=route.generation_id, applied_position=route.applied_position)
    watch.lap("scope_resolve")
    if cache_probe is not None and cache_probe(route, profile, watch):
        return _Ranked(
            route=route,
            profile=profile,
            depths=depths,
            fused=[],
            candidate_count=0,
            indexes_used=[],
            watch=watch,
            cached=True,
        )

    use_vector = bool(text) and profile.vector_weight > 0.0
    query_vector = ports.query_vectors.vector(text) if use_vector else None
    watch.lap("candidate_fetch")

    indexes_used: list[str] = []
    lexical: list[Candidate] = []
    vector: list[Candidate] = []
    if profile.lexical_weight > 0.0 or not use_vector:
        lexical = ports.lexical.search(
            route.generation_id,
            text,
            search_filter,
            depths["lexical"],
            field_boosts=profile.lexical_boosts(),
        )
        indexes_used.append("bm25" if text else "filter")
    if query_vector is not None:
        vector = ports.vectors.search(
            route.generation_id, query_vector, search_filter, depths["vector"]
        )
        indexes_used.append("vector")
    if search_filter != SearchFilter() or (
        isinstance(profile, WeightedProfile) and profile.metadata_weight > 0.0
    ):
        indexes_used.append("metadata")
    source_counts = {"lexical": len(lexical), "vector": len(vector)}
    watch.plan.update(indexes_used=indexes_used, source_counts=source_counts)
    watch.lap("index_search")

    rescored: Rescored | None = None
    if isinstance(profile, WeightedProfile) and profile.missing == "rescore" and text:
        rescored = _rescore(
            route.generation_id, text, query_vector, search_filter, lexical, vector, ports, profile
        )
    fused = fuse(
        profile,
        lexical,
        vector,
        now=ports.clock(),
        half_life_days=limits.freshness_half_life_days,
        rescored=rescored,
    )
    rescored_count = 0 if rescored is None else rescored.looked_up
    watch.plan.update(candidate_count=len(fused), rescored_count=rescored_count)
    watch.lap("rerank")
    return _Ranked(
        route=route,
        profile=profile,
        depths=depths,
        fused=fused,
        candidate_count=len(fused),
        indexes_used=indexes_used,
        watch=watch,
        source_counts=source_counts,
        rescored_count=rescored_count,
    )


def _rescore(
    generation_id: str,
    text: str,
    query_vector: Sequence[float] | None,
    search_filter: SearchFilter,
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    ports: QueryPorts,
    profile: FusionProfile,
) -> Rescored:
    """Exact scores of each source's candidates in the other source, fetched by id.

    Both ports restrict before scoring and never change scores, so an id filter returns
    each listed document's own score (lexical: its BM25 under the profile's field boosts,
    absent when no term matches; vectors: its cosine, computed exactly because so few
    points pass the filter). Two extra engine calls at most, each bounded by the
    candidate depth.
    """
    lexical_ids = {c.document_id for c in lexical}
    vector_ids = {c.document_id for c in vector}
    only_vector = sorted(vector_ids - lexical_ids)
    only_lexical = sorted(lexical_ids - vector_ids)
    lexical_scores: dict[str, float] = {}
    vector_scores: dict[str, float] = {}
    looked_up = 0
    if lexical_ids and only_vector:
        by_id = search_filter.model_copy(update={"document_ids": tuple(only_vector)})
        found = ports.lexical.search(
            generation_id, text, by_id, len(only_vector), field_boosts=profile.lexical_boosts()
        )
        lexical_scores = {c.document_id: c.score for c in found}
        looked_up += len(only_vector)
    if query_vector is not None and vector_ids and only_lexical:
        by_id = search_filter.model_copy(update={"document_ids": tuple(only_lexical)})
        found = ports.vectors.search(generation_id, query_vector, by_id, len(only_lexical))
        vector_scores = {c.document_id: c.score for c in found}
        looked_up += len(only_lexical)
    return Rescored(lexical=lexical_scores, vector=vector_scores, looked_up=looked_up)


def _plan(ranked: _Ranked, mode: str, cache: str = "disabled") -> QueryPlan:
    return QueryPlan(
        candidate_scope_mode="allowed_doc_ids" if mode == "allowed_doc_ids" else "scope_ref",
        candidate_count=ranked.candidate_count,
        indexes_used=ranked.indexes_used,
        reranked_count=len(ranked.fused),
        latency_ms=ranked.watch.latency(),
        generation_id=ranked.route.generation_id,
        applied_position=ranked.route.applied_position,
        profile=ranked.profile.id,
        cache=cache,
        candidate_depth=max(ranked.depths.values()),
        candidate_depths=ranked.depths,
        source_counts=ranked.source_counts,
        rescored_count=ranked.rescored_count,
        fallback=ranked.route.fallback,
    )


def _response_key(
    request: TopKRequest, principal: Principal, route: Route, profile: FusionProfile
) -> str:
    """Everything a response depends on: the generation and the writes it reflects
    (`commit_seq` counts its committed batches, so it moves even when partitions
    deliver positions out of order), the caller's reach, the normalized request (minus
    what does not change results) and the full recipe of the profile it resolved to (so
    a changed server default or operator profile never serves an old ranking)."""
    normalized = request.model_dump(
        mode="json", exclude={"client_request_id", "timeout_seconds", "profile", "ranking"}
    )
    return "topk:" + sha256_json(
        {
            "generation_id": route.generation_id,
            "applied_position": route.applied_position,
            "commit_seq": route.commit_seq,
            "principal": [principal.namespace, principal.galaxy],
            "request": normalized,
            "profile": profile.model_dump(mode="json"),
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

    def probe(route: Route, profile: FusionProfile, watch: _Stopwatch) -> bool:
        nonlocal cache_state, cached, cache_key
        if ports.responses is None:
            return False
        cache_key = _response_key(request, principal, route, profile)
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
        profile_id=request.profile,
        ranking=request.ranking,
        limit=request.result_limit,
        allowed_doc_ids=None,
        timeout_seconds=request.timeout_seconds,
        ports=ports,
        limits=limits,
        cache_probe=probe,
    )
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
        profile=ranked.profile.id,
        client_request_id=request.client_request_id,
        results=results,
        query_plan=_plan(ranked, "scope_ref", cache_state) if request.include.query_plan else None,
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
        profile_id=request.profile,
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
        profile=ranked.profile.id,
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
        query_plan=_plan(ranked, mode),
    )


def _breakdown(candidate: FusedCandidate) -> ScoreBreakdown:
    return ScoreBreakdown(
        lexical=round(candidate.lexical, 6),
        vector=round(candidate.vector, 6),
        freshness=round(candidate.freshness, 6),
        metadata=round(candidate.metadata, 6),
    )
