"""Use cases of the query worker: the one-shot top-k and the generic retrieve."""

from __future__ import annotations

import json
import logging
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from pydantic_core import from_json

from contracts.digests import sha256_hex, sha256_json
from contracts.embedding import Embedder
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import Candidate, SearchFilter
from contracts.phrases import PhrasePlan, PhrasePlanReport
from contracts.profiles import FusionProfile, RrfProfile, WeightedProfile
from contracts.request_context import current as current_request
from contracts.request_context import note_namespace
from contracts.shards import shard_report
from contracts.timing import engine_clock, gil_let_go_watch
from contracts.topk import (
    MAX_ALLOWED_DOC_IDS,
    CandidateOut,
    ContinuationPlan,
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
from contracts.trusted import trusted_constructor
from query.cursors import SORT, CursorCodec, CursorPosition, paginate
from query.fusion import FusedCandidate, Rescored, fuse, fuse_top
from query.overlap import DeadlinePassed, Pending, SourcePool
from query.phrases import ResolvedPhrasePlan, VocabularyRegistry
from query.ports import (
    Answered,
    Cache,
    LexicalSearch,
    QueryObserver,
    RecordReader,
    Route,
    RouteAdmission,
    Routing,
    StoredRecord,
    VectorSearch,
)
from query.profiles import ProfileRegistry
from query.record_cache import RecordCache
from query.scopes import ScopeResolver, ScopeTarget, merge_filters
from query.tenant_lru import TenantLru

__all__ = [
    "Principal",
    "QueryEmbeddingCache",
    "QueryLimits",
    "QueryPorts",
    "RingHit",
    "RingHits",
    "RingSearch",
    "admitted_route",
    "search_rings",
    "topk_records",
]

log = logging.getLogger("orrery.query")

# What a response reports of the response cache (`QueryPlan.cache`).
CacheState = Literal["hit", "miss", "unavailable", "disabled"]


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

    max_result_limit: int = 500
    candidate_depth: int = 100
    freshness_half_life_days: float = 30.0
    response_ttl_seconds: float = 300.0
    embedding_ttl_seconds: float = 86_400.0
    lexical_depth: int | None = None
    vector_depth: int | None = None
    profiles: ProfileRegistry = field(default_factory=ProfileRegistry)
    vocabularies: VocabularyRegistry = field(default_factory=VocabularyRegistry)
    paging_depth: int | None = None

    def depths(self, profile: FusionProfile, limit: int, *, paged: bool = False) -> dict[str, int]:
        """Candidates to fetch from each source for `profile` and a result limit; a
        paged request's first page fetches `paging_depth` per source when it is set
        (every later page reuses the first page's depths: they are its window)."""
        lexical = profile.lexical_depth or self.lexical_depth or self.candidate_depth
        vector = profile.vector_depth or self.vector_depth or self.candidate_depth
        if paged and self.paging_depth is not None:
            lexical = vector = self.paging_depth
        floor = max(limit, profile.rank_window if isinstance(profile, RrfProfile) else 0)
        return {"lexical": max(lexical, floor), "vector": max(vector, floor)}


class QueryEmbeddingCache:
    """Query vectors by `(embedder_id, text)`, per tenant: a bounded in-process LRU per
    namespace (`query.tenant_lru`: one tenant's queries never evict another's vectors)
    in front of an optional shared cache (Redis in server mode, keys per tenant).
    Thread-safe; a shared-cache failure only costs an embedding."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        capacity: int = 512,
        max_tenants: int = 16,
        shared: Cache | None = None,
        ttl_seconds: float = 86_400.0,
    ) -> None:
        self._embedder = embedder
        self._shared = shared
        self._ttl = ttl_seconds
        # ~12 KiB per 384-d vector (a tuple of floats): at most capacity × max_tenants.
        self._items: TenantLru[str, tuple[float, ...]] = TenantLru(
            max_entries=capacity, max_bytes=2**62, max_tenants=max_tenants
        )

    @property
    def embedder_id(self) -> str:
        return self._embedder.embedder_id

    @property
    def dimension(self) -> int:
        return self._embedder.dimension

    def vector(self, text: str, *, tenant: str = "") -> tuple[float, ...]:
        hit = self._items.get(tenant, text)
        if hit is not None:
            return hit
        key = f"qv:{self.embedder_id}:{sha256_hex(text.encode())}"
        vector = self._shared_get(key, tenant)
        if vector is None:
            vector = self._embedder.embed([text])[0]
            self._shared_set(key, vector, tenant)
        self._items.put(tenant, text, vector)
        return vector

    def _shared_get(self, key: str, tenant: str) -> tuple[float, ...] | None:
        if self._shared is None:
            return None
        try:
            raw = self._shared.get(key, tenant=tenant)
        except DependencyUnavailable as exc:
            log.debug("query-vector cache unavailable: %s", exc.message)
            return None
        return None if raw is None else tuple(json.loads(raw))

    def _shared_set(self, key: str, vector: tuple[float, ...], tenant: str) -> None:
        if self._shared is None:
            return
        try:
            self._shared.set(key, json.dumps(vector).encode(), self._ttl, tenant=tenant)
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
    scopes: ScopeResolver | None = None
    cursors: CursorCodec | None = None
    # Runs a request's two sources (and its two score lookups) side by side; None: one
    # after the other on the request's thread. Rankings are the same either way.
    overlap: SourcePool | None = None
    # With `overlap`: whether a generation's queries use it (None: every generation's).
    # Those it refuses run their sources one after the other, the vector search first.
    overlap_for: Callable[[str], bool] | None = None
    # With `overlap`: the request's thread calls the vector engine only once the pool's
    # lexical search has let the GIL go (`contracts.timing.gil_let_go`; it waits at most
    # `_LET_GO_WAIT_S`). Embedded: qdrant-edge keeps the GIL through its search, so a
    # lexical search still in Python when it starts waits for all of it.
    lexical_first: bool = False
    # Told about every answer (metrics, spans); None: nobody listens.
    observer: QueryObserver | None = None
    # Keeps the records answers were made of, per tenant (`query.record_cache`); None:
    # every answer reads them from `records`.
    record_cache: RecordCache | None = None

    def overlap_of(self, generation_id: str) -> SourcePool | None:
        """`overlap`, if `generation_id`'s queries use it."""
        pool = self.overlap
        if pool is None or self.overlap_for is None or self.overlap_for(generation_id):
            return pool
        return None

    def fetch_records(
        self, namespace: str, keys: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], StoredRecord]:
        """`records.fetch(keys)` for a query of `namespace`, through `record_cache`."""
        if self.record_cache is None:
            return self.records.fetch(keys)
        return self.record_cache.fetch(self.records, namespace, keys)


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
        # Milliseconds inside engine library calls (`contracts.timing`), by engine.
        self.engine_ms: dict[str, float] = {}
        self.shards: dict[str, dict[str, Any]] = {}
        self._mark = self.start

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] += (now - self._mark) * 1000.0
        self._mark = now
        if now > self.deadline:
            raise self.overrun(stage)

    def wait(self, pending: Pending[Any], stage: str) -> Any:
        """The result of a call running beside this request, waited for until the
        deadline (then `DEADLINE_EXCEEDED` for `stage`, like `lap`)."""
        try:
            return pending.result(self.deadline)
        except DeadlinePassed:
            self.lap(stage)
            raise self.overrun(stage) from None

    def overrun(self, stage: str) -> OrreryError:
        """The error of a request whose deadline passed during `stage`."""
        return OrreryError(
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
        stages = self.stages
        return _LATENCY(
            scope_resolve=round(stages["scope_resolve"], 3),
            candidate_fetch=round(stages["candidate_fetch"], 3),
            index_search=round(stages["index_search"], 3),
            rerank=round(stages["rerank"], 3),
            payload_materialize=round(stages["payload_materialize"], 3),
            total=round(total, 3),
        )


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
class _Paging:
    """A paged request (page_size or cursor): its cursor codec, the fingerprint
    material, the page size and, past page 1, the position its cursor carried.

    Every page ranks with page 1's depths and ranking time, on page 1's generation, so
    re-running the ranking reproduces page 1's order (as long as the generation took no
    writes: `generation_changed` says when it did).
    """

    codec: CursorCodec
    material: dict[str, Any]
    page_size: int
    position: CursorPosition | None
    depths: dict[str, int]
    ranked_at: datetime
    items: list[FusedCandidate] = field(default_factory=list)
    next_position: CursorPosition | None = None
    next_cursor: str | None = None
    continuation: ContinuationPlan | None = None

    def cache_key(self) -> dict[str, Any]:
        """What a page's response depends on beyond the request: where it starts."""
        return {
            "page_size": self.page_size,
            "depths": dict(sorted(self.depths.items())),
            "position": None if self.position is None else self.position.as_json(),
        }


# Request fields a cursor does not bind: they may change from page to page (page size,
# presentation, deadline, id), or it binds them in another form (text digest, merged
# filters, the resolved profile). Every other field — present or added later — is bound.
_UNBOUND = frozenset(
    {
        "cursor",
        "page_size",
        "result_limit",
        "limit",
        "include",
        "timeout_seconds",
        "client_request_id",
        "query_text",
        "filters",
        "profile",
        "ranking",
        "allowed_doc_ids",
    }
)


def _bound_fields(request: TopKRequest | RetrieveRequest) -> dict[str, Any]:
    return request.model_dump(mode="json", exclude=set(_UNBOUND))


def _paged(request: TopKRequest | RetrieveRequest) -> bool:
    """Whether the request asks for a page (only a page's cursor binds the request)."""
    return request.page_size is not None or request.cursor is not None


def _fingerprint_material(
    endpoint: str,
    bound: dict[str, Any],
    text: str,
    filters: QueryFilters,
    galaxy: str | None,
    allowed_doc_ids: Sequence[str] | None,
    profile: FusionProfile,
) -> dict[str, Any]:
    """The invariant request a cursor binds (privacy-safe: digests, never the text);
    any-of lists are sorted, so their order does not matter."""
    raw = filters.model_dump(mode="json", exclude={"galaxy"})
    normalized = {
        **raw,
        "status": None if raw["status"] is None else sorted(raw["status"]),
        "visibility": None if raw["visibility"] is None else sorted(raw["visibility"]),
        "facets": {k: sorted(v) for k, v in sorted(raw["facets"].items())},
    }
    return {
        "endpoint": endpoint,
        "request": bound,
        "filters": normalized,
        "galaxy": galaxy,
        "allowed_doc_ids": None
        if allowed_doc_ids is None
        else sha256_json(sorted(set(allowed_doc_ids))),
        "profile": profile.id,
        "profile_recipe": sha256_json(profile.model_dump(mode="json")),
        "query_text": sha256_hex(text.encode()),
        "sort": SORT,
    }


def _page_size(page_size: int | None, limit: int, limit_given: bool) -> int:
    if page_size is None:
        return limit
    if limit_given and limit != page_size:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "page_size replaces the result limit: give one of them (or the same value)",
            {"page_size": page_size, "limit": limit},
        )
    return page_size


def _finish_page(paging: _Paging, fused: list[FusedCandidate], route: Route, now: datetime) -> None:
    """Cut this page out of the fused window and issue the next cursor, if any."""
    position = paging.position
    after = None if position is None else (position.after_score, position.after_document_id)
    page = paginate(fused, paging.page_size, after)
    paging.items = list(page.items)
    first_seq = route.commit_seq if position is None else position.commit_seq
    number = 1 if position is None else position.page + 1
    expires: datetime | None = None
    if page.has_more and paging.items:
        last = paging.items[-1]
        paging.next_position = CursorPosition(
            generation_id=route.generation_id,
            commit_seq=first_seq,
            ranked_at=paging.ranked_at,
            depths=paging.depths,
            page=number,
            offset=page.offset + len(paging.items),
            after_score=last.score,
            after_document_id=last.document_id,
        )
        paging.next_cursor, expires = paging.codec.issue(
            paging.next_position, paging.material, now=now
        )
    paging.continuation = ContinuationPlan(
        page=number,
        page_size=paging.page_size,
        offset=page.offset,
        window=page.window,
        window_exhausted=not page.has_more,
        generation_id=route.generation_id,
        generation_changed=route.commit_seq != first_seq,
        expires_at=None if expires is None else expires.isoformat(),
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
    paging: _Paging | None = None
    pinned_generation: str | None = None
    phrase_plan: PhrasePlanReport | None = None
    # The vector source's candidates (their own cosines: `search_rings` reads them).
    vector: Sequence[Candidate] = ()

    def top(self, limit: int) -> list[FusedCandidate]:
        """This answer's candidates: the page of a paged request, else the top `limit`."""
        return self.fused[:limit] if self.paging is None else self.paging.items

    def first_rank(self) -> int:
        """The rank of this answer's first result (pages continue their ranks)."""
        if self.paging is None or self.paging.continuation is None:
            return 1
        return self.paging.continuation.offset + 1


@dataclass(slots=True)
class _Resolved:
    """What the request resolved to before any index is searched: the stages' input."""

    text: str
    filters: QueryFilters
    galaxy: str | None
    phrases: ResolvedPhrasePlan
    profile: FusionProfile
    target: ScopeTarget
    now: datetime
    paging: _Paging | None
    depths: dict[str, int]
    route: Route
    pinned: str | None
    search_filter: SearchFilter
    lexical_text: str
    query_vector: tuple[float, ...] | None = None


@dataclass(slots=True)
class _Sources:
    """Each source's candidates, and the query vector they were found with."""

    query_vector: tuple[float, ...] | None
    lexical: list[Candidate]
    vector: list[Candidate]
    indexes_used: list[str]
    # The lexical scores of the vector candidates, looked up while the lexical search
    # still ran (a re-scoring profile with `ports.overlap`); None: not looked up.
    lexical_scores: dict[str, float] | None = None
    # The exact vector scores of the lexical candidates, looked up on the pool thread
    # right after the lexical search (`_VectorScoresAfter`); None: not looked up.
    vector_scores: dict[str, float] | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {"lexical": len(self.lexical), "vector": len(self.vector)}


@dataclass(frozen=True, slots=True)
class _Ask:
    """A ranking request as the pipeline sees it (`topk_records` and `retrieve` alike)."""

    principal: Principal
    namespace: str
    scope_ref: str
    query_text: str
    filters: QueryFilters
    profile_id: str | None
    ranking: Ranking
    limit: int
    allowed_doc_ids: Sequence[str] | None
    timeout_seconds: float
    endpoint: str = "topk"
    page_size: int | None = None
    cursor: str | None = None
    bound: dict[str, Any] | None = None
    phrase_plan: PhrasePlan | None = None
    report_plan: bool = True
    # The query vector to search with instead of embedding `query_text`.
    query_vector: tuple[float, ...] | None = None
    # Only documents in exactly these rings (`SearchFilter.rings`).
    rings: tuple[str, ...] | None = None
    # Read this generation (as a cursor's pin does), not the live one.
    generation_id: str | None = None


def _rank(
    ask: _Ask,
    *,
    ports: QueryPorts,
    limits: QueryLimits,
    cache_probe: Callable[[Route, FusionProfile, _Stopwatch, dict[str, Any]], bool] | None = None,
) -> _Ranked:
    """The pipeline, one stage a step: resolve the scope (and page), probe the cache,
    search both sources, re-score and fuse, page. Each stage's time is one lap."""
    watch = _Stopwatch(ask.timeout_seconds)
    note_namespace(ask.namespace)
    if ask.limit > limits.max_result_limit:
        raise OrreryError(
            ErrorCode.RESULT_LIMIT_EXCEEDED,
            f"result_limit may be at most {limits.max_result_limit}, got {ask.limit}",
            {"max_result_limit": limits.max_result_limit},
        )
    q = _resolve(ask, ports=ports, limits=limits, watch=watch)
    watch.lap("scope_resolve")
    ranked = _Ranked(
        route=q.route,
        profile=q.profile,
        depths=q.depths,
        fused=[],
        candidate_count=0,
        indexes_used=[],
        watch=watch,
        paging=q.paging,
        pinned_generation=q.pinned,
    )
    if cache_probe is not None and cache_probe(q.route, q.profile, watch, _cache_extra(q)):
        ranked.cached = True
        return ranked
    with engine_clock() as watch.engine_ms, shard_report() as watch.shards:
        sources = _search_sources(q, ports, watch)
        _fuse_and_page(
            q,
            sources,
            ranked,
            ports=ports,
            limits=limits,
            limit=ask.limit,
            report_plan=ask.report_plan,
        )
    watch.lap("rerank")
    return ranked


def _resolve(ask: _Ask, *, ports: QueryPorts, limits: QueryLimits, watch: _Stopwatch) -> _Resolved:
    """Stage 1: who may read what, the scope and its fixed filters, the profile, the
    phrase plan, the page (cursor) and the eligible generation to search."""
    namespace, scope_ref, limit = ask.namespace, ask.scope_ref, ask.limit
    text = ask.query_text.strip()
    galaxy = _authorize(ask.principal, namespace, ask.filters)
    phrases = limits.vocabularies.resolve(namespace, ask.phrase_plan)
    profile = limits.profiles.resolve(ask.profile_id, ask.ranking)
    resolver = ports.scopes or ScopeResolver(ports.routing)
    target = resolver.target(namespace, scope_ref)
    # A scope's fixed filters narrow like the request's own.
    filters = merge_filters(ask.filters, target.definition.filters)
    if (
        not text
        and ask.query_vector is None
        and filters.is_empty()
        and ask.allowed_doc_ids is None
        and not phrases.narrows
    ):
        raise OrreryError(
            ErrorCode.EMPTY_QUERY, "query_text is empty and no filter narrows the scope"
        )
    now = ports.clock()
    paging: _Paging | None = None
    if ask.page_size is not None or ask.cursor is not None:
        material = _fingerprint_material(
            ask.endpoint,
            ask.bound or {"namespace": namespace, "scope_ref": scope_ref},
            text,
            filters,
            galaxy,
            ask.allowed_doc_ids,
            profile,
        )
        if phrases.active:
            material["phrase_plan"] = phrases.fingerprint
        paging = _open_paging(ask.cursor, material, limit, profile, ports, limits, now)
    depths = limits.depths(profile, limit) if paging is None else paging.depths
    watch.plan.update(profile=profile.id, candidate_depths=depths)
    cursor_generation = (
        ask.generation_id
        if paging is None or paging.position is None
        else (paging.position.generation_id)
    )
    route = resolver.route(namespace, target, generation_id=cursor_generation)
    pinned = target.pinned_generation or cursor_generation
    route = _admit(route, scope_ref, pinned, ports)
    if pinned is not None:
        watch.plan.update(pinned_generation=pinned)
    search_filter = phrases.restrict(_search_filter(filters, galaxy, ask.allowed_doc_ids))
    if ask.rings is not None:
        search_filter = search_filter.model_copy(update={"rings": ask.rings})
    watch.plan.update(generation_id=route.generation_id, applied_position=route.applied_position)
    return _Resolved(
        text=text,
        filters=filters,
        galaxy=galaxy,
        phrases=phrases,
        profile=profile,
        target=target,
        now=now,
        paging=paging,
        depths=depths,
        route=route,
        pinned=pinned,
        search_filter=search_filter,
        lexical_text=phrases.lexical_text(text),
        query_vector=ask.query_vector,
    )


def _open_paging(
    cursor: str | None,
    material: dict[str, Any],
    limit: int,
    profile: FusionProfile,
    ports: QueryPorts,
    limits: QueryLimits,
    now: datetime,
) -> _Paging:
    """A paged request: the cursor's position (verified against `material`), or page 1."""
    if ports.cursors is None:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "this worker does not page")
    position = None if cursor is None else ports.cursors.open(cursor, material, now=now)
    return _Paging(
        codec=ports.cursors,
        material=material,
        page_size=limit,
        position=position,
        depths=dict(position.depths)
        if position is not None
        else limits.depths(profile, limit, paged=True),
        ranked_at=now if position is None else position.ranked_at,
    )


def _admit(route: Route, scope_ref: str, pinned: str | None, ports: QueryPorts) -> Route:
    """The eligible generation to read (a declared fallback, or an error), whose
    embedder is this worker's."""
    if ports.eligibility is not None:
        admitted = ports.eligibility.admit(route, scope_ref)
        if pinned is not None and admitted.generation_id != route.generation_id:
            # A pin or a cursor reads its generation or nothing: never another one.
            raise OrreryError(
                ErrorCode.COVERAGE_UNAVAILABLE,
                f"pinned generation {route.generation_id} is not eligible; a pinned "
                "request takes no fallback",
                {"generation_id": route.generation_id, "scope_ref": scope_ref},
            )
        route = admitted
    if route.embedder_id != ports.query_vectors.embedder_id:
        raise OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"generation {route.generation_id} was built with {route.embedder_id}, this "
            f"worker embeds with {ports.query_vectors.embedder_id}",
        )
    return route


def _cache_extra(q: _Resolved) -> dict[str, Any]:
    """What a cached response depends on beyond the request and the generation."""
    fixed = q.target.definition.filters
    return {
        "scope_filters": None if fixed is None else fixed.model_dump(mode="json"),
        "page": None if q.paging is None else q.paging.cache_key(),
        "phrase_plan": q.phrases.fingerprint,
    }


def _search_sources(q: _Resolved, ports: QueryPorts, watch: _Stopwatch) -> _Sources:
    """Stages 2 and 3: embed the query (lap `candidate_fetch`), then search the vector
    and the lexical index, both restricted before scoring (lap `index_search`).

    With `ports.overlap` the lexical search starts first, beside the embedding and the
    vector search (its time then shows in whichever lap it ends in). One after the
    other, the vector search goes first: a vector engine that keeps the GIL
    (qdrant-edge) is then not slowed by a lexical pass beside it, and the re-score
    reads the lexical pass's scores right after it (docs/bench/README.md, session
    22)."""
    profile = q.profile
    use_vector = (bool(q.text) or q.query_vector is not None) and profile.vector_weight > 0.0
    generation_id = q.route.generation_id
    use_lexical = profile.lexical_weight > 0.0 or not use_vector

    def search_lexical() -> list[Candidate]:
        return ports.lexical.search(
            generation_id,
            q.lexical_text,
            q.search_filter,
            q.depths["lexical"],
            field_boosts=profile.lexical_boosts(),
        )

    lexical: Pending[list[Candidate]] | None = None
    after = _VectorScoresAfter(q, ports, search_lexical)
    overlap = ports.overlap_of(generation_id) if use_lexical and use_vector else None
    if overlap is not None:
        call = after.search if _rescores(q) else search_lexical
        if ports.lexical_first:
            lexical = _start_lexical_first(overlap, call)
        else:
            lexical = overlap.start(call)
    given = q.query_vector
    sources = _Sources(
        query_vector=(
            given
            if given is not None
            else ports.query_vectors.vector(q.text, tenant=q.route.namespace)
        )
        if use_vector
        else None,
        lexical=[],
        vector=[],
        indexes_used=[],
    )
    after.vector = sources.query_vector
    watch.lap("candidate_fetch")
    # A failure of both sources reports the lexical one, whichever order they ran in.
    vector_error: Exception | None = None
    if sources.query_vector is not None:
        try:
            vector_filter = q.phrases.vector_filter(q.search_filter, generation_id, ports.lexical)
            sources.vector = ports.vectors.search(
                generation_id, sources.query_vector, vector_filter, q.depths["vector"]
            )
        except Exception as exc:
            if not use_lexical:
                raise
            vector_error = exc
        if lexical is not None and vector_error is None and _rescores(q) and lexical.running():
            sources.lexical_scores = _prefetch_lexical_scores(q, sources.vector, ports)
    if use_lexical and lexical is None:
        sources.lexical = search_lexical()
    if lexical is not None:
        sources.lexical = watch.wait(lexical, "index_search")
        sources.vector_scores = after.scores
    if vector_error is not None:
        raise vector_error
    if use_lexical:
        sources.indexes_used.append("bm25" if q.lexical_text else "filter")
    if sources.query_vector is not None:
        sources.indexes_used.append("vector")
    if q.search_filter != _NO_FILTER or (
        isinstance(profile, WeightedProfile) and profile.metadata_weight > 0.0
    ):
        sources.indexes_used.append("metadata")
    watch.plan.update(indexes_used=sources.indexes_used, source_counts=sources.counts)
    watch.lap("index_search")
    return sources


T = TypeVar("T")

# The longest `_start_lexical_first` waits for the lexical search to let the GIL go (its
# Python part before tantivy's search: analysis, queries, document frequencies, ~0.1-0.5 ms).
_LET_GO_WAIT_S = 0.003

# `Candidate` fields by position: C-level getters for the re-score's passes over them.
_DOCUMENT_ID = operator.itemgetter(0)
_REVISION = operator.itemgetter(1)
# What "no filter" is: built once, not per query.
_NO_FILTER = SearchFilter()


def _start_lexical_first(
    pool: SourcePool, call: Callable[[], T], *, wait_s: float = _LET_GO_WAIT_S
) -> Pending[T]:
    """`pool.start(call)`, returning once `call` has entered an engine call that lets the
    GIL go (`contracts.timing.gil_let_go`), or ended, or `wait_s` passed
    (`QueryPorts.lexical_first`). The same call with the same result: only when the
    request's thread goes on changes."""

    def run() -> T:
        try:
            return call()
        finally:
            let_go.set()

    with gil_let_go_watch() as let_go:
        pending = pool.start(run)
    if pending.running() or pending.queued():
        let_go.wait(wait_s)
    return pending


class _VectorScoresAfter:
    """The lexical search, then, on the same (pool) thread, the exact vector scores of
    all its candidates, when the query vector is known by then (set by the request's
    thread once embedded; never waited for). The re-score's vector lookup then runs
    beside the vector search instead of after both searches. A lookup by id returns each
    document's own score whatever else is listed, so the re-score keeps exactly the ones
    it needs. A failure here is not reported: the re-score then looks them up itself."""

    __slots__ = ("_ports", "_q", "_search", "scores", "vector")

    def __init__(
        self, q: _Resolved, ports: QueryPorts, search: Callable[[], list[Candidate]]
    ) -> None:
        self._q, self._ports, self._search = q, ports, search
        self.vector: tuple[float, ...] | None = None
        self.scores: dict[str, float] | None = None

    def search(self) -> list[Candidate]:
        found = self._search()
        vector = self.vector
        if vector is None or not found:
            return found
        q = self._q
        by_ids = q.search_filter.with_ids(
            tuple(sorted(set(map(_DOCUMENT_ID, found)))), phrases=False
        )
        try:
            self.scores = self._ports.vectors.scores(
                q.route.generation_id,
                vector,
                by_ids,
                revisions={c.document_id: c.revision for c in found},
                tenant=q.route.namespace,
            )
        except OrreryError:
            self.scores = None
        return found


def _rescores(q: _Resolved) -> bool:
    """Whether the ranking looks missing scores up (`_rescore`)."""
    profile = q.profile
    return isinstance(profile, WeightedProfile) and profile.missing == "rescore" and bool(q.text)


def _prefetch_lexical_scores(
    q: _Resolved, vector: Sequence[Candidate], ports: QueryPorts
) -> dict[str, float] | None:
    """The lexical scores of every vector candidate, looked up while the lexical search
    still runs: the re-score needs those of the candidates the lexical source will not
    return, not yet known. A lookup by id returns each document's own score whatever
    else is listed, so the re-score keeps exactly the ones it needs. A failure here is
    not reported: the re-score then looks them up itself (and reports its failure)."""
    if not vector:
        return None
    by_ids = q.search_filter.with_ids(tuple(sorted(set(map(_DOCUMENT_ID, vector)))))
    try:
        return ports.lexical.scores(
            q.route.generation_id,
            q.lexical_text,
            by_ids,
            field_boosts=q.profile.lexical_boosts(),
        )
    except OrreryError:
        return None


def _fuse_and_page(
    q: _Resolved,
    sources: _Sources,
    ranked: _Ranked,
    *,
    ports: QueryPorts,
    limits: QueryLimits,
    limit: int,
    report_plan: bool,
) -> None:
    """Stage 4: re-score (weighted profiles that look missing scores up), fuse, report
    the phrase plan, cut the page; fills `ranked`."""
    profile = q.profile
    rescored: Rescored | None = None
    if _rescores(q):
        rescored = _rescore(
            q.route.generation_id,
            q.lexical_text,
            sources.query_vector,
            q.search_filter,
            sources.lexical,
            sources.vector,
            ports,
            profile,
            watch=ranked.watch,
            prefetched=sources.lexical_scores,
            prefetched_vector=sources.vector_scores,
            tenant=q.route.namespace,
        )
    # The report costs a lexical lookup per phrase: only made when the plan is returned.
    report_phrases = report_plan and q.phrases.vocabulary is not None
    if q.paging is None and not report_phrases:
        # Only the top `limit` is read: fused exactly are only those that can be in it.
        fused, count = fuse_top(
            profile,
            sources.lexical,
            sources.vector,
            limit=limit,
            now=q.now,
            half_life_days=limits.freshness_half_life_days,
            rescored=rescored,
        )
    else:
        fused = fuse(
            profile,
            sources.lexical,
            sources.vector,
            now=q.now if q.paging is None else q.paging.ranked_at,
            half_life_days=limits.freshness_half_life_days,
            rescored=rescored,
        )
        count = len(fused)
    ranked.rescored_count = 0 if rescored is None else rescored.looked_up
    ranked.watch.plan.update(candidate_count=count, rescored_count=ranked.rescored_count)
    if report_phrases:
        ranked.phrase_plan = q.phrases.report(
            (c.document_id for c in fused), q.route.generation_id, ports.lexical
        )
    if q.paging is not None:
        _finish_page(q.paging, fused, q.route, q.now)
    ranked.fused = fused
    ranked.vector = sources.vector
    ranked.candidate_count = count
    ranked.indexes_used = sources.indexes_used
    ranked.source_counts = sources.counts


def _rescore(
    generation_id: str,
    text: str,
    query_vector: Sequence[float] | None,
    search_filter: SearchFilter,
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    ports: QueryPorts,
    profile: FusionProfile,
    *,
    watch: _Stopwatch,
    prefetched: dict[str, float] | None = None,
    prefetched_vector: dict[str, float] | None = None,
    tenant: str = "",
) -> Rescored:
    """Exact scores of each source's candidates in the other source, fetched by id.

    Both ports restrict before scoring and never change scores, so a lookup by id
    (`scores`) returns each listed document's own score (lexical: its BM25 under the
    profile's field boosts, absent when no term matches; vectors: its exact cosine).
    Two extra engine calls at most, each bounded by the candidate depth; neither builds
    candidates. With `ports.overlap` the two run side by side. `prefetched`: lexical
    scores of (at least) every vector candidate, looked up already; `prefetched_vector`:
    vector scores of (at least) every lexical candidate, likewise.
    """
    lexical_ids = set(map(_DOCUMENT_ID, lexical))
    vector_ids = set(map(_DOCUMENT_ID, vector))
    only_vector = sorted(vector_ids - lexical_ids)
    only_lexical = sorted(lexical_ids - vector_ids)
    looked_up = 0
    vector_scores: dict[str, float] = {}
    lookup_vectors: Callable[[], dict[str, float]] | None = None
    if query_vector is not None and vector_ids and only_lexical:
        # Lexical candidates passed the phrase groups already; vector engines take none.
        by_ids = search_filter.with_ids(tuple(only_lexical), phrases=False)

        # The revisions the lexical source found them at: an adapter holding those
        # revisions' vectors scores them without another engine call (kept per tenant).
        # Every lexical candidate's (one each): the adapter reads those of the ids listed.
        revisions = dict(zip(map(_DOCUMENT_ID, lexical), map(_REVISION, lexical), strict=True))

        def lookup_vectors() -> dict[str, float]:
            assert query_vector is not None
            return ports.vectors.scores(
                generation_id, query_vector, by_ids, revisions=revisions, tenant=tenant
            )

        looked_up += len(only_lexical)
        if prefetched_vector is not None:
            known = prefetched_vector
            vector_scores = {d: known[d] for d in only_lexical if d in known}
            lookup_vectors = None
    pending: Pending[dict[str, float]] | None = None
    if lookup_vectors is not None and prefetched is None:
        overlap = ports.overlap_of(generation_id)
        if overlap is not None:
            pending = overlap.start(lookup_vectors)
    lexical_scores: dict[str, float] = {}
    if lexical_ids and only_vector:
        if prefetched is not None:
            lexical_scores = {d: prefetched[d] for d in only_vector if d in prefetched}
        else:
            by_id = search_filter.with_ids(tuple(only_vector))
            lexical_scores = ports.lexical.scores(
                generation_id, text, by_id, field_boosts=profile.lexical_boosts()
            )
        looked_up += len(only_vector)
    if pending is not None:
        vector_scores = watch.wait(pending, "rerank")
    elif lookup_vectors is not None:
        vector_scores = lookup_vectors()
    return Rescored(lexical=lexical_scores, vector=vector_scores, looked_up=looked_up)


def _plan(ranked: _Ranked, mode: str, cache: CacheState = "disabled") -> QueryPlan:
    # Built without re-validation: every value is this module's own, typed already
    # (`contracts.trusted`: every field, in declaration order).
    return _PLAN(
        candidate_scope_mode="allowed_doc_ids" if mode == "allowed_doc_ids" else "scope_ref",
        candidate_count=ranked.candidate_count,
        indexes_used=ranked.indexes_used,
        reranked_count=ranked.candidate_count,
        latency_ms=ranked.watch.latency(),
        engine_ms={k: round(v, 3) for k, v in sorted(ranked.watch.engine_ms.items())},
        shards=dict(sorted(ranked.watch.shards.items())),
        generation_id=ranked.route.generation_id,
        applied_position=ranked.route.applied_position,
        profile=ranked.profile.id,
        cache=cache,
        candidate_depth=max(ranked.depths.values()),
        candidate_depths=ranked.depths,
        source_counts=ranked.source_counts,
        rescored_count=ranked.rescored_count,
        phrase_plan=ranked.phrase_plan,
        fallback=ranked.route.fallback,
        pinned_generation=ranked.pinned_generation,
        continuation=None if ranked.paging is None else ranked.paging.continuation,
        trace_id=_trace_id(),
    )


def _trace_id() -> str | None:
    request = current_request()
    return None if request is None else request.trace_id


def _response_key(
    request: TopKRequest,
    principal: Principal,
    route: Route,
    profile: FusionProfile,
    extra: dict[str, Any] | None = None,
) -> str:
    """Everything a response depends on: the generation and the writes it reflects
    (`commit_seq` counts its committed batches, so it moves even when partitions
    deliver positions out of order), the caller's reach, the normalized request (minus
    what does not change results), the full recipe of the profile it resolved to (so
    a changed server default or operator profile never serves an old ranking), the
    scope's fixed filters and, for a page, where it starts (the position its cursor
    carried — not the cursor text, which changes with every issue)."""
    normalized = request.model_dump(
        mode="json",
        exclude={"client_request_id", "timeout_seconds", "profile", "ranking", "cursor"},
    )
    return "topk:" + sha256_json(
        {
            "generation_id": route.generation_id,
            "applied_position": route.applied_position,
            "commit_seq": route.commit_seq,
            "principal": [principal.namespace, principal.galaxy],
            "request": normalized,
            "profile": profile.model_dump(mode="json"),
            **(extra or {}),
        }
    )


@dataclass(slots=True)
class _ResponseProbe:
    """The response cache as `topk_records` uses it: probed once the route is known
    (a hit skips every search), written after a miss."""

    request: TopKRequest
    principal: Principal
    ports: QueryPorts
    state: CacheState = "disabled"
    key: str = ""
    tenant: str = ""
    cached: TopKResponse | None = None
    cached_next: CursorPosition | None = None

    def __post_init__(self) -> None:
        self.state = "disabled" if self.ports.responses is None else "miss"

    def __call__(
        self, route: Route, profile: FusionProfile, watch: _Stopwatch, extra: dict[str, Any]
    ) -> bool:
        if self.ports.responses is None:
            return False
        self.key = _response_key(self.request, self.principal, route, profile, extra)
        self.tenant = route.namespace
        try:
            raw = self.ports.responses.get(self.key, tenant=route.namespace)
        except DependencyUnavailable as exc:
            log.warning("response cache unavailable: %s", exc.message)
            self.state = "unavailable"
            return False
        if raw is None:
            return False
        if extra["page"] is None:
            self.cached = TopKResponse.model_validate_json(raw)
        else:
            # A page is stored with the exact position its next cursor continues from,
            # so a hit issues a fresh cursor (a new expiry) instead of an old one.
            envelope = json.loads(raw)
            self.cached = TopKResponse.model_validate(envelope["response"])
            nxt = envelope["next"]
            self.cached_next = None if nxt is None else CursorPosition.from_json(nxt)
        self.state = "hit"
        return True

    def store(self, response: TopKResponse, paging: _Paging | None, ttl_seconds: float) -> None:
        if self.ports.responses is None or self.state != "miss":
            return
        if paging is None:
            value = response.model_dump_json().encode()
        else:
            nxt = paging.next_position
            value = json.dumps(
                {
                    "response": response.model_dump(mode="json"),
                    "next": None if nxt is None else nxt.as_json(),
                }
            ).encode()
        try:
            self.ports.responses.set(self.key, value, ttl_seconds, tenant=self.tenant)
        except DependencyUnavailable as exc:
            log.warning("response cache unavailable: %s", exc.message)


def topk_records(
    request: TopKRequest, *, principal: Principal, ports: QueryPorts, limits: QueryLimits
) -> TopKResponse:
    """One round trip: resolve the scope, search both indexes with filters before
    scoring, fuse, take the top k, and materialize their payloads (top k only) from the
    canonical store at exactly the revisions the generation ranked.

    Whole responses are cached under a key that binds the generation id and applied log
    position, so a write or a promote can never be answered from a stale entry.

    With `page_size` or `cursor` the answer is one page (`query.cursors`): results
    strictly after the cursor's search-after tuple on the cursor's generation, ranks
    counted from the first page, and `next_cursor` while the candidate window holds more.
    """
    page_size = _page_size(
        request.page_size, request.result_limit, "result_limit" in request.model_fields_set
    )
    probe = _ResponseProbe(request, principal, ports)
    ranked = _rank(
        _Ask(
            principal=principal,
            namespace=request.namespace,
            scope_ref=request.scope_ref,
            query_text=request.query_text,
            filters=request.filters,
            profile_id=request.profile,
            ranking=request.ranking,
            limit=page_size,
            allowed_doc_ids=None,
            timeout_seconds=request.timeout_seconds,
            endpoint="topk",
            page_size=request.page_size,
            cursor=request.cursor,
            bound=_bound_fields(request) if _paged(request) else None,
            phrase_plan=request.phrase_plan,
            report_plan=request.include.query_plan,
        ),
        ports=ports,
        limits=limits,
        cache_probe=probe,
    )
    if probe.cached is not None:
        cached = _from_cache(
            probe.cached, probe.cached_next, request.client_request_id, ranked, ports
        )
        _observe(ports, "topk", ranked, probe.state)
        return cached
    results = _materialize(request, ranked, ranked.top(page_size), ports)
    ranked.watch.lap("payload_materialize")
    response = TopKResponse.model_construct(
        success=True,
        scope_ref=request.scope_ref,
        generation_id=ranked.route.generation_id,
        profile=ranked.profile.id,
        client_request_id=request.client_request_id,
        results=results,
        query_plan=_plan(ranked, "scope_ref", probe.state) if request.include.query_plan else None,
        next_cursor=None if ranked.paging is None else ranked.paging.next_cursor,
    )
    probe.store(response, ranked.paging, limits.response_ttl_seconds)
    _observe(ports, "topk", ranked, probe.state)
    return response


def _observe(ports: QueryPorts, endpoint: str, ranked: _Ranked, cache: CacheState) -> None:
    if ports.observer is not None:
        watch = ranked.watch
        ports.observer.answered(
            Answered(endpoint, watch.stages, watch.engine_ms, cache, ranked.source_counts)
        )


def _materialize(
    request: TopKRequest, ranked: _Ranked, top: Sequence[FusedCandidate], ports: QueryPorts
) -> list[TopKResult]:
    """The results with what the request includes, read from the canonical store at
    exactly the revisions ranked (one read for the page).

    Built without re-validation (`model_construct`, `contracts.trusted`): every value is
    typed already, and payloads and metadata are the stored record's own, validated when
    it was written — walking each payload again cost more than parsing it."""
    stored = ports.fetch_records(ranked.route.namespace, [(c.document_id, c.revision) for c in top])
    include = request.include
    with_payload, with_metadata = include.payload, include.metadata
    with_content, with_breakdown = include.content, include.score_breakdown
    construct = _RESULT
    results: list[TopKResult] = []
    for rank, candidate in enumerate(top, start=ranked.first_rank()):
        row = stored.get((candidate.document_id, candidate.revision))
        if row is None:
            raise OrreryError(
                ErrorCode.COVERAGE_UNAVAILABLE,
                f"document {candidate.document_id} revision {candidate.revision} is "
                "indexed but missing from the record store",
                {"generation_id": ranked.route.generation_id},
            )
        # pydantic's parser: the same value as `json.loads` for every stored record
        # (checked over a 100k corpus), in two thirds of its time.
        record: dict[str, Any] = from_json(row.record_json)
        metadata: dict[str, Any] | None = None
        if with_metadata:
            metadata = record["metadata"]
            metadata.update(
                snapshot_kind=row.snapshot_kind,
                galaxy=row.galaxy,
                ring=record.get("ring", ""),
                revision=row.revision,
                payload_sha256=row.payload_sha256,
            )
        results.append(
            construct(
                rank=rank,
                document_id=candidate.document_id,
                item_id=row.item_id,
                payload_schema=record.get("payload_schema", ""),
                payload=record["payload"] if with_payload else None,
                metadata=metadata,
                content=record["text"] if with_content else None,
                score=round(candidate.score, 6),
                score_breakdown=_breakdown(candidate) if with_breakdown else None,
            )
        )
    return results


def _from_cache(
    cached: TopKResponse,
    next_position: CursorPosition | None,
    client_request_id: str | None,
    ranked: _Ranked,
    ports: QueryPorts,
) -> TopKResponse:
    """A cached answer with this request's id and timings and, for a page, a freshly
    issued next cursor."""
    plan = cached.query_plan
    next_cursor = None
    if ranked.paging is not None and next_position is not None:
        next_cursor, expires = ranked.paging.codec.issue(
            next_position, ranked.paging.material, now=ports.clock()
        )
        if plan is not None and plan.continuation is not None:
            plan = plan.model_copy(
                update={
                    "continuation": plan.continuation.model_copy(
                        update={"expires_at": expires.isoformat()}
                    )
                }
            )
    if plan is not None:
        plan = plan.model_copy(
            update={
                "latency_ms": ranked.watch.latency(),
                "engine_ms": {},
                "cache": "hit",
                "trace_id": _trace_id(),
            }
        )
    return cached.model_copy(
        update={
            "client_request_id": client_request_id,
            "query_plan": plan,
            "next_cursor": next_cursor,
        }
    )


def retrieve(
    request: RetrieveRequest, *, principal: Principal, ports: QueryPorts, limits: QueryLimits
) -> RetrieveResponse:
    """The generic API: ranked candidates (ids, revisions, scores), no payloads; pages
    like `topk_records` with `page_size` / `cursor`."""
    if request.allowed_doc_ids is not None and len(request.allowed_doc_ids) > MAX_ALLOWED_DOC_IDS:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "too many allowed_doc_ids")
    page_size = _page_size(request.page_size, request.limit, "limit" in request.model_fields_set)
    ranked = _rank(
        _Ask(
            principal=principal,
            namespace=request.namespace,
            scope_ref=request.scope_ref,
            query_text=request.query_text,
            filters=request.filters,
            profile_id=request.profile,
            ranking=request.ranking,
            limit=page_size,
            allowed_doc_ids=request.allowed_doc_ids,
            timeout_seconds=request.timeout_seconds,
            endpoint="retrieve",
            page_size=request.page_size,
            cursor=request.cursor,
            bound=_bound_fields(request) if _paged(request) else None,
            phrase_plan=request.phrase_plan,
        ),
        ports=ports,
        limits=limits,
    )
    top = ranked.top(page_size)
    mode = "allowed_doc_ids" if request.allowed_doc_ids is not None else "scope_ref"
    _observe(ports, "retrieve", ranked, "disabled")
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
            for rank, c in enumerate(top, start=ranked.first_rank())
        ],
        query_plan=_plan(ranked, mode),
        next_cursor=None if ranked.paging is None else ranked.paging.next_cursor,
    )


# `model_construct` without its per-call walk over the fields (`contracts.trusted`): two
# models per result of every answer.
_RESULT = trusted_constructor(TopKResult)
_PLAN = trusted_constructor(QueryPlan)
_LATENCY = trusted_constructor(LatencyMs)
_BREAKDOWN = trusted_constructor(ScoreBreakdown)


def _breakdown(candidate: FusedCandidate) -> ScoreBreakdown:
    return _BREAKDOWN(
        lexical=round(candidate.lexical, 6),
        vector=round(candidate.vector, 6),
        freshness=round(candidate.freshness, 6),
        metadata=round(candidate.metadata, 6),
    )


def admitted_route(
    namespace: str, scope_ref: str, *, principal: Principal, ports: QueryPorts
) -> Route:
    """The eligible generation a request on `scope_ref` reads now (after the key's
    namespace is checked): what `search_rings` is then pinned to, so that planning and
    searching see one generation."""
    _authorize(principal, namespace, QueryFilters())
    resolver = ports.scopes or ScopeResolver(ports.routing)
    target = resolver.target(namespace, scope_ref)
    route = resolver.route(namespace, target)
    return _admit(route, scope_ref, target.pinned_generation, ports)


@dataclass(frozen=True, slots=True)
class RingSearch:
    """A ranking restricted to rings before scoring (the KoutenDB envelope's search).

    `rings`: only documents in exactly these rings (None: the whole galaxy);
    `query_vector`: searched with instead of embedding `query_text`; `mode`: `hybrid`
    (both sources, the fusion profile), `vector` (cosine only: no lexical source, no
    freshness or metadata component) or `lexical` (BM25 only); `generation_id`: the
    generation to read (`admitted_route`'s).
    """

    principal: Principal
    namespace: str
    scope_ref: str
    galaxy: str
    mode: str
    limit: int
    generation_id: str
    query_text: str = ""
    query_vector: tuple[float, ...] | None = None
    rings: tuple[str, ...] | None = None
    profile_id: str | None = None
    timeout_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class RingHit:
    """One ranked document: its score (the fused score; the cosine in `vector` mode)
    and its stored revision."""

    document_id: str
    score: float
    record: StoredRecord


@dataclass(frozen=True, slots=True)
class RingHits:
    route: Route
    profile: str
    hits: list[RingHit]
    latency: LatencyMs


_MODE_RANKING = {
    "hybrid": Ranking(),
    "vector": Ranking(lexical_weight=0.0, freshness_weight=0.0, metadata_weight=0.0),
    "lexical": Ranking(vector_weight=0.0),
}


def search_rings(request: RingSearch, *, ports: QueryPorts, limits: QueryLimits) -> RingHits:
    """Rank with the hybrid pipeline (`topk_records`' stages), restricted to
    `request.rings` in every source before scoring, and read the top `limit` documents
    at the revisions ranked. No response cache: the envelope is built per request."""
    ranked = _rank(
        _Ask(
            principal=request.principal,
            namespace=request.namespace,
            scope_ref=request.scope_ref,
            query_text=request.query_text,
            filters=QueryFilters(galaxy=request.galaxy),
            profile_id=request.profile_id,
            ranking=_MODE_RANKING[request.mode],
            limit=request.limit,
            allowed_doc_ids=None,
            timeout_seconds=request.timeout_seconds,
            endpoint="koutendb",
            report_plan=False,
            query_vector=request.query_vector,
            rings=request.rings,
            generation_id=request.generation_id,
        ),
        ports=ports,
        limits=limits,
    )
    top = ranked.top(request.limit)
    stored = ports.fetch_records(ranked.route.namespace, [(c.document_id, c.revision) for c in top])
    hits: list[RingHit] = []
    vector_scores = {c.document_id: c.score for c in ranked.vector}
    for candidate in top:
        row = stored.get((candidate.document_id, candidate.revision))
        if row is None:
            raise OrreryError(
                ErrorCode.COVERAGE_UNAVAILABLE,
                f"document {candidate.document_id} revision {candidate.revision} is "
                "indexed but missing from the record store",
                {"generation_id": ranked.route.generation_id},
            )
        score = (
            vector_scores.get(candidate.document_id, 0.0)
            if request.mode == "vector"
            else candidate.score
        )
        hits.append(RingHit(candidate.document_id, round(score, 6), row))
    ranked.watch.lap("payload_materialize")
    return RingHits(
        route=ranked.route,
        profile=ranked.profile.id,
        hits=hits,
        latency=ranked.watch.latency(),
    )
