"""The one-shot `topk_records` request and response, and the generic retrieve API.

Shapes follow the ChonkyDB one-shot seed field for field; `generation_id` and `profile`
are added so every answer names the versions it came from. Unknown request fields are
rejected.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.generations import CoverageFallback

# `Namespace`: a namespace no record can have (NUL, `/`, …) is 422, not a scope that is
# never ready (503).
from contracts.names import Namespace
from contracts.phrases import PhrasePlan, PhrasePlanReport
from contracts.records import AwareDatetime, Name
from contracts.wire import JsonInt

__all__ = [
    "MAX_RESULT_LIMIT",
    "CandidateOut",
    "ContinuationPlan",
    "DocumentIdsResponse",
    "Include",
    "LatencyMs",
    "QueryFilters",
    "QueryPlan",
    "Ranking",
    "RecordsByIdRequest",
    "RecordsByIdResponse",
    "RetrieveRequest",
    "RetrieveResponse",
    "ScoreBreakdown",
    "StoredRecordOut",
    "TopKRequest",
    "TopKResponse",
    "TopKResult",
]

MAX_RESULT_LIMIT = 500
# Bounds a server's configuration sets (`contracts.openapi.DEPLOYMENT`): in
# `docs/schemas/` the default deployment's, in a served document the server's.
LIMIT_FACT: dict[str, Any] = {
    "x-orrery-deployment": "max_result_limit",
    "maximum": MAX_RESULT_LIMIT,
}
PROFILES_FACT: dict[str, Any] = {"x-orrery-deployment": "fusion_profiles"}
MAX_ALLOWED_DOC_IDS = 100_000
MAX_CURSOR_LENGTH = 4_096

_PAGE_SIZE_DESCRIPTION = (
    "Ask for pages: each page holds at most page_size results and `next_cursor` "
    "continues (null on the last page). Replaces the result limit; giving both with "
    "different values is refused. None = one page of the result limit, no cursor."
)
_CURSOR_DESCRIPTION = (
    "`next_cursor` of the previous page. The rest of the request must be the same "
    "(the cursor binds its fingerprint; only page_size, include, timeout_seconds and "
    "client_request_id may change); the page continues on the generation the first "
    "page used, even after a promote."
)


class _Strict(BaseModel):
    # Strict types: a JSON `true` or `"2"` is not an integer, `"yes"` not a boolean
    # (docs/reliability.md); floats take JSON integers too.
    model_config = ConfigDict(extra="forbid", strict=True)


class QueryFilters(_Strict):
    """Pre-score filters. Every list means any-of; an empty list matches nothing."""

    status: list[str] | None = Field(default=None, max_length=64)
    visibility: list[str] | None = Field(default=None, max_length=64)
    galaxy: Name | None = Field(
        default=None, description="Narrows to one galaxy; it can never widen the API key's."
    )
    updated_after: AwareDatetime | None = None
    updated_before: AwareDatetime | None = None
    facets: dict[str, list[str]] = Field(default_factory=dict, max_length=32)

    def is_empty(self) -> bool:
        return (
            self.status is None
            and self.visibility is None
            and self.galaxy is None
            and self.updated_after is None
            and self.updated_before is None
            and not self.facets
        )


class Ranking(_Strict):
    """Weight overrides of the fusion profile. Each component is normalized to [0, 1]
    before weighting.

    A weight left out (or null) keeps the profile's; a weight given replaces it, and the
    response then names a derived profile id (`weighted@2+w:3f9a1c2b`). `rrf` profiles
    take only `lexical_weight` and `vector_weight` (a positive freshness or metadata
    weight is refused).
    """

    lexical_weight: float | None = Field(default=None, ge=0.0, le=100.0)
    vector_weight: float | None = Field(default=None, ge=0.0, le=100.0)
    freshness_weight: float | None = Field(default=None, ge=0.0, le=100.0)
    metadata_weight: float | None = Field(default=None, ge=0.0, le=100.0)

    def overrides(self) -> dict[str, float]:
        """The weights the client gave, by field name."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Include(_Strict):
    payload: bool = True
    metadata: bool = True
    content: bool = False
    score_breakdown: bool = True
    query_plan: bool = True


class TopKRequest(_Strict):
    namespace: Namespace
    scope_ref: str = Field(min_length=1, max_length=256)
    query_text: str = Field(default="", max_length=4_096)
    result_limit: JsonInt = Field(default=10, ge=1, json_schema_extra=LIMIT_FACT)
    response_mode: Literal["structured_records"] = "structured_records"
    filters: QueryFilters = Field(default_factory=QueryFilters)
    profile: str | None = Field(
        default=None,
        max_length=256,
        description="Fusion profile id (e.g. 'rrf@1'); None = the server's "
        "ORRERY_DEFAULT_PROFILE. Unknown ids are refused (unknown_profile); the served "
        "document lists the server's.",
        json_schema_extra=PROFILES_FACT,
    )
    ranking: Ranking = Field(default_factory=Ranking)
    phrase_plan: PhrasePlan | None = Field(
        default=None,
        description="Controlled-term phrase groups (request data, never query text): "
        "required groups restrict every source before scoring (docs/query.md)",
    )
    include: Include = Field(default_factory=Include)
    timeout_seconds: float = Field(default=2.0, gt=0.0, le=60.0)
    client_request_id: str | None = Field(default=None, max_length=256)
    page_size: JsonInt | None = Field(
        default=None,
        ge=1,
        description=_PAGE_SIZE_DESCRIPTION,
        json_schema_extra={**LIMIT_FACT, "minimum": 1},
    )
    cursor: str | None = Field(
        default=None, min_length=1, max_length=MAX_CURSOR_LENGTH, description=_CURSOR_DESCRIPTION
    )


class ScoreBreakdown(BaseModel):
    lexical: float
    vector: float
    freshness: float
    metadata: float


class TopKResult(BaseModel):
    rank: int
    document_id: str
    item_id: str
    payload_schema: str
    payload: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    content: dict[str, Any] | None = None
    score: float
    score_breakdown: ScoreBreakdown | None = None


class LatencyMs(BaseModel):
    scope_resolve: float
    candidate_fetch: float
    index_search: float
    rerank: float
    payload_materialize: float
    total: float


class ContinuationPlan(BaseModel):
    """Where a paged answer stands.

    `page` counts from 1; `offset` results came before this page; `window` is the
    number of fused candidates the paged ranking reaches (the candidate window, fixed
    by the first page: nothing beyond it is ever returned); `window_exhausted` says this
    page reached its end (then `next_cursor` is null even if the scope holds more
    matches). `generation_changed` is true when the pinned generation took writes since
    the first page (search-after keeps going, but a document whose score moved across
    the page boundary can then appear twice or not at all).
    """

    page: int
    page_size: int
    offset: int
    window: int
    window_exhausted: bool
    generation_id: str
    generation_changed: bool = False
    expires_at: str | None = Field(
        default=None, description="When `next_cursor` expires (ISO 8601), if there is one"
    )


class QueryPlan(BaseModel):
    """How an answer was made.

    `candidate_count`: distinct candidates both sources returned together;
    `reranked_count`: candidates the fusion profile scored; `candidate_depth`: the
    larger of the per-source depths in `candidate_depths`; `source_counts`: candidates
    each source returned; `rescored_count`: missing components looked up exactly by id
    (profiles with `missing: rescore`).
    """

    candidate_scope_mode: Literal["scope_ref", "allowed_doc_ids"]
    candidate_count: int
    indexes_used: list[str]
    reranked_count: int
    latency_ms: LatencyMs
    engine_ms: dict[str, float] = Field(
        default_factory=dict,
        description="Milliseconds spent inside engine library calls while answering, by "
        "engine call (embedded: `tantivy_search`, `tantivy_doc_reads`, "
        "`qdrant_edge_query`, `flat_vectors` and `flat_lexical` for a generation scored "
        "from its in-memory copies; servers: `opensearch_search` and `qdrant_query`, the "
        "calls' wall time in the worker, and `opensearch_took` and `qdrant_time`, the time "
        "the engines report for them); the rest of `latency_ms.total` is Orrery's own work. "
        "Empty for a response-cache hit.",
    )
    shards: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per source of a spread generation: shards searched, the cap asked of "
        "each, copies searched and copies bypassed with the reason, and for vectors the "
        "HNSW ef each shard key was searched with (`hnsw_ef`). Empty for one shard.",
    )
    generation_id: str
    applied_position: int
    profile: str
    cache: Literal["hit", "miss", "unavailable", "disabled"] = "disabled"
    candidate_depth: int
    candidate_depths: dict[str, int] = Field(default_factory=dict)
    source_counts: dict[str, int] = Field(default_factory=dict)
    rescored_count: int = 0
    phrase_plan: PhrasePlanReport | None = Field(
        default=None, description="How the request's phrase plan resolved and matched"
    )
    fallback: CoverageFallback | None = Field(
        default=None,
        description="Set when the live generation was not eligible and the configured "
        "coverage fallback answered instead",
    )
    pinned_generation: str | None = Field(
        default=None,
        description="The generation the scope ref (`…@g42`) or the cursor pinned; None = "
        "the scope's live generation answered",
    )
    continuation: ContinuationPlan | None = Field(
        default=None, description="Set for paged requests (page_size or cursor)"
    )
    trace_id: str | None = Field(
        default=None,
        description="The OpenTelemetry trace of this request (32 hex digits) when the "
        "server traces (ORRERY_TRACING=true); its spans name each stage",
    )


class TopKResponse(BaseModel):
    success: Literal[True] = True
    scope_ref: str
    generation_id: str
    profile: str
    client_request_id: str | None = None
    results: list[TopKResult]
    query_plan: QueryPlan | None = None
    next_cursor: str | None = Field(
        default=None, description="Continues a paged request; null on the last page"
    )


class RetrieveRequest(_Strict):
    """The generic API: ranked candidates without payloads."""

    namespace: Namespace
    scope_ref: str = Field(min_length=1, max_length=256)
    query_text: str = Field(default="", max_length=4_096)
    limit: JsonInt = Field(default=10, ge=1, json_schema_extra=LIMIT_FACT)
    filters: QueryFilters = Field(default_factory=QueryFilters)
    profile: str | None = Field(
        default=None,
        max_length=256,
        description="Fusion profile id (e.g. 'rrf@1'); None = the server's "
        "ORRERY_DEFAULT_PROFILE. Unknown ids are refused (unknown_profile); the served "
        "document lists the server's.",
        json_schema_extra=PROFILES_FACT,
    )
    ranking: Ranking = Field(default_factory=Ranking)
    phrase_plan: PhrasePlan | None = Field(
        default=None,
        description="Controlled-term phrase groups (request data, never query text): "
        "required groups restrict every source before scoring (docs/query.md)",
    )
    allowed_doc_ids: list[str] | None = Field(default=None, max_length=MAX_ALLOWED_DOC_IDS)
    timeout_seconds: float = Field(default=2.0, gt=0.0, le=60.0)
    client_request_id: str | None = Field(default=None, max_length=256)
    page_size: JsonInt | None = Field(
        default=None,
        ge=1,
        description=_PAGE_SIZE_DESCRIPTION,
        json_schema_extra={**LIMIT_FACT, "minimum": 1},
    )
    cursor: str | None = Field(
        default=None, min_length=1, max_length=MAX_CURSOR_LENGTH, description=_CURSOR_DESCRIPTION
    )


class CandidateOut(BaseModel):
    rank: int
    document_id: str
    revision: int
    score: float
    score_breakdown: ScoreBreakdown


class RetrieveResponse(BaseModel):
    success: Literal[True] = True
    scope_ref: str
    generation_id: str
    profile: str
    candidates: list[CandidateOut]
    query_plan: QueryPlan
    next_cursor: str | None = Field(
        default=None, description="Continues a paged request; null on the last page"
    )


class DocumentIdsResponse(BaseModel):
    """The document ids a scope currently covers (the split path's first call)."""

    success: Literal[True] = True
    scope_ref: str
    generation_id: str
    document_ids: list[str]


class RecordsByIdRequest(_Strict):
    namespace: Namespace
    document_ids: list[str] = Field(min_length=1, max_length=1_000)


class StoredRecordOut(BaseModel):
    document_id: str
    item_id: str
    revision: int
    payload_schema: str
    payload: dict[str, Any]
    metadata: dict[str, Any]


class RecordsByIdResponse(BaseModel):
    success: Literal[True] = True
    records: list[StoredRecordOut]
    missing: list[str]
