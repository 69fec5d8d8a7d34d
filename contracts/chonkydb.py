"""ChonkyDB's external API dialect (`/v1/external/*`) as Twinr's client speaks it.

Wire shapes only (docs/chonkydb.md maps every field onto Orrery's). Requests are strict
like Orrery's own (unknown fields are `422 unknown_field`); responses carry ChonkyDB's
field names (`payload_id`, `results[]`, `indexes_used`, …) next to Orrery's (`rank`,
`item_id`, `generation_id`, `profile`), so a ChonkyDB client reads what it expects and
nothing Orrery names is lost.

Where a path serves both shapes (`retrieve`, `retrieve/topk_records`), a body with any
field of `TOPK_DIALECT_FIELDS` / `RETRIEVE_DIALECT_FIELDS` is read as ChonkyDB's; any
other body is Orrery's own, unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from contracts.names import Namespace
from contracts.records import AwareDatetime, Name
from contracts.topk import (
    LIMIT_FACT,
    MAX_ALLOWED_DOC_IDS,
    QueryFilters,
    QueryPlan,
    ScoreBreakdown,
)
from contracts.wire import JsonInt

__all__ = [
    "ALLOWED_INDEXES",
    "BY_ID_QUERY",
    "MAX_BY_ID",
    "RETRIEVE_DIALECT_FIELDS",
    "TOPK_DIALECT_FIELDS",
    "AuthInfoResponse",
    "BulkItemOut",
    "BulkRecordItem",
    "BulkRecordsRequest",
    "BulkRecordsResponse",
    "ByIdPlan",
    "ChonkyRetrieveHit",
    "ChonkyRetrieveRequest",
    "ChonkyRetrieveResponse",
    "ChonkyTopKHit",
    "ChonkyTopKRequest",
    "ChonkyTopKResponse",
    "DeleteRecordResponse",
    "InstanceResponse",
    "JobAccepted",
    "JobStatusResponse",
    "RecordListResponse",
    "RecordOut",
    "RecordSummary",
    "is_dialect",
]

# Fields only ChonkyDB's request shapes have: their presence selects the dialect.
TOPK_DIALECT_FIELDS = frozenset(
    {
        "mode",
        "include_content",
        "include_metadata",
        "content_mode",
        "max_content_chars",
        "allowed_indexes",
        "allowed_doc_ids",
        "temporal_start",
        "temporal_end",
    }
)
# Orrery's own retrieve takes `allowed_doc_ids` too, so it does not select the dialect.
RETRIEVE_DIALECT_FIELDS = (TOPK_DIALECT_FIELDS - {"allowed_doc_ids"}) | {"result_limit"}
# The by-id call: at most this many ids, answered exactly from the record store.
MAX_BY_ID = 500
# The query text Twinr sends with `allowed_doc_ids` when it wants those records, not a
# ranking of them (an empty text means the same).
BY_ID_QUERY = "__allowed_doc_ids__"
# `allowed_indexes` names Orrery understands, by the source each one means.
ALLOWED_INDEXES: dict[str, str] = {
    "bm25": "lexical",
    "lexical": "lexical",
    "fulltext": "lexical",
    "vector": "vector",
}


def is_dialect(raw: object, fields: frozenset[str]) -> bool:
    """Whether a parsed JSON body is in ChonkyDB's shape (has one of `fields`)."""
    return isinstance(raw, dict) and any(name in raw for name in fields)


class _Strict(BaseModel):
    # Strict types, like Orrery's own requests (`contracts.topk`).
    model_config = ConfigDict(extra="forbid", strict=True)


# What the routes require and a field's type cannot say: a scope to rank in, or the
# documents to answer (else `422 invalid_request`), as JSON Schema says it.
_SCOPE_OR_IDS: JsonDict = {
    "anyOf": [
        {"required": ["scope_ref"], "properties": {"scope_ref": {"type": "string"}}},
        {"required": ["allowed_doc_ids"], "properties": {"allowed_doc_ids": {"type": "array"}}},
    ]
}
# Blank as Python's `str.strip` sees it.
_BLANK = (
    "[\\u0009-\\u000d\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a"
    "\\u2028\\u2029\\u202f\\u205f\\u3000]*"
)
# The by-id call (`allowed_doc_ids` with a blank query or `BY_ID_QUERY`) takes at most
# `MAX_BY_ID` ids: the query texts that make it one.
_BY_ID_QUERY_TEXT = f"^{_BLANK}(?:__allowed_doc_ids__)?{_BLANK}$"


_INDEXES_DESCRIPTION = (
    "Sources to rank with: names containing 'fulltext', 'bm25' or 'lexical' mean the "
    "lexical index, names containing 'vector' the vector index (ChonkyDB's "
    "'ccodex_memory_fulltext', 'ccodex_memory_vector_768' work); a source left out "
    "gets weight 0. Other names are refused."
)


class _DialectQuery(_Strict):
    mode: Literal["advanced"] = Field(
        default="advanced", description="ChonkyDB's retrieval mode; Orrery has one"
    )
    query_text: str = Field(default="", max_length=4_096)
    result_limit: JsonInt = Field(default=10, ge=1, json_schema_extra=LIMIT_FACT)
    include_content: bool = False
    include_metadata: bool = True
    content_mode: str | None = Field(
        default=None, max_length=64, description="Accepted; Orrery returns the stored text"
    )
    max_content_chars: JsonInt | None = Field(
        default=None,
        ge=1,
        description="Truncates each result's content body",
        json_schema_extra={"minimum": 1},
    )
    timeout_seconds: float = Field(default=2.0, gt=0.0, le=60.0)
    filters: QueryFilters = Field(default_factory=QueryFilters)
    temporal_start: AwareDatetime | None = Field(
        default=None, description="= filters.updated_after"
    )
    temporal_end: AwareDatetime | None = Field(default=None, description="= filters.updated_before")
    client_request_id: str | None = Field(default=None, max_length=256)
    allowed_indexes: list[str] | None = Field(
        default=None, min_length=1, max_length=8, description=_INDEXES_DESCRIPTION
    )
    namespace: Namespace | None = Field(
        default=None, description="None = the API key's namespace (required without a key)"
    )
    scope_ref: str | None = Field(default=None, min_length=1, max_length=256)


class ChonkyTopKRequest(_DialectQuery):
    """ChonkyDB's `topk_records` request. With `allowed_doc_ids` and `query_text`
    empty or `BY_ID_QUERY` it is the by-id call: those documents' current records, in
    the order asked, at most `result_limit` and `MAX_BY_ID`; no ranking (`scope_ref`
    and `filters` other than `galaxy` are not used). With `allowed_doc_ids` and a real
    `query_text` it ranks within those documents (the scope: `scope_ref`, else the one
    scope their snapshot kind belongs to)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            **_SCOPE_OR_IDS,
            "if": {"properties": {"query_text": {"pattern": _BY_ID_QUERY_TEXT}}},
            "then": {"properties": {"allowed_doc_ids": {"maxItems": MAX_BY_ID}}},
        },
    )

    allowed_doc_ids: list[str] | None = Field(default=None, max_length=MAX_ALLOWED_DOC_IDS)


class ChonkyRetrieveRequest(_DialectQuery):
    """ChonkyDB's `retrieve` request: ranked hits with metadata (no payloads)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_SCOPE_OR_IDS)

    allowed_doc_ids: list[str] | None = Field(default=None, max_length=MAX_ALLOWED_DOC_IDS)


class ChonkyTopKHit(BaseModel):
    rank: int
    payload_id: str = Field(description="= document_id")
    document_id: str
    item_id: str
    revision: int
    payload_schema: str
    score: float
    relevance_score: float = Field(description="= score")
    source_index: str
    candidate_origin: str
    payload_source: str = "payload"
    payload: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    content: dict[str, Any] | None = None
    score_breakdown: ScoreBreakdown | None = None


class ByIdPlan(BaseModel):
    """How the by-id call was answered: exactly, from the record store."""

    candidate_scope_mode: Literal["allowed_doc_ids"] = "allowed_doc_ids"
    requested: int
    found: int
    indexes_used: list[str] = Field(default_factory=list)
    latency_ms: dict[str, float]


class ChonkyTopKResponse(BaseModel):
    success: Literal[True] = True
    mode: str = "advanced"
    scope_ref: str | None = None
    generation_id: str | None = None
    profile: str | None = None
    client_request_id: str | None = None
    results: list[ChonkyTopKHit]
    indexes_used: list[str]
    query_plan: QueryPlan | ByIdPlan | None = None


class ChonkyRetrieveHit(BaseModel):
    rank: int
    payload_id: str = Field(description="= document_id")
    document_id: str
    revision: int
    score: float
    relevance_score: float
    source_index: str
    candidate_origin: str
    metadata: dict[str, Any] | None = None
    score_breakdown: ScoreBreakdown


class ChonkyRetrieveResponse(BaseModel):
    """`scope_ref`, `generation_id`, `profile` and `query_plan` are None only when
    nothing was ranked: none of `allowed_doc_ids` is a current record."""

    success: Literal[True] = True
    mode: str = "advanced"
    scope_ref: str | None
    generation_id: str | None
    profile: str | None
    results: list[ChonkyRetrieveHit]
    indexes_used: list[str]
    query_plan: QueryPlan | None


class InstanceResponse(BaseModel):
    success: Literal[True] = True
    service: str = "orrery"
    ready: bool
    auth_enabled: bool


class AuthInfoResponse(BaseModel):
    """ChonkyDB's `admin/auth`: how a client authenticates (no key material)."""

    success: Literal[True] = True
    auth_enabled: bool
    scheme: Literal["api_key"] = "api_key"
    header_name: Literal["x-api-key"] = "x-api-key"
    allow_bearer: Literal[True] = True
    exempt_paths: list[str] = Field(default_factory=lambda: ["/healthz"])
    api_key_configured: bool


class RecordSummary(BaseModel):
    payload_id: str = Field(description="= document_id")
    chonky_id: str = Field(description="= document_id")
    document_id: str
    item_id: str
    snapshot_kind: str
    revision: int
    metadata: dict[str, Any] | None = None


class RecordListResponse(BaseModel):
    success: Literal[True] = True
    namespace: str | None = Field(description="None: every namespace (no API keys)")
    offset: int
    limit: int
    total_count: int
    returned_count: int
    payloads: list[RecordSummary]


class RecordOut(BaseModel):
    """One current record (`GET records/{id}`, `GET documents/full`)."""

    success: Literal[True] = True
    payload_id: str = Field(description="= document_id")
    chonky_id: str = Field(description="= document_id")
    document_id: str
    item_id: str
    snapshot_kind: str
    revision: int
    payload_schema: str
    payload: dict[str, Any]
    metadata: dict[str, Any]
    content: str | None = Field(
        default=None, description="The stored text body (title first), when asked for"
    )
    origin_uri: str | None = Field(
        default=None, description="The `uri` the record was written with (facet origin_uri)"
    )
    document: RecordOut | None = Field(
        default=None, description="`GET records/{id}?include_document=true`: the same record"
    )


class DeleteRecordResponse(BaseModel):
    success: Literal[True] = True
    payload_id: str
    document_id: str
    deleted: Literal[True] = True
    revision: int = Field(description="The tombstone's revision")


class BulkRecordItem(_Strict):
    """One ChonkyDB record item. Identity (docs/chonkydb.md): `namespace` (else
    `metadata.twinr_namespace`, a `twinr://longterm/<namespace>/…` uri, the API key's),
    `snapshot_kind` (else `metadata.twinr_snapshot_kind`, the uri's next segment),
    `item_id` (else `uri`, else `payload.memory_id`). `revision` None = the stored one
    + 1. The payload is `payload`, else `metadata.twinr_payload`; the lexical body is
    `content`, else the payload's text values."""

    payload: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    content: str | None = Field(default=None, max_length=200_000)
    uri: str | None = Field(default=None, min_length=1, max_length=512)
    file_path: str | None = Field(default=None, max_length=1_024)
    file_type: str | None = Field(default=None, max_length=64)
    language: str | None = Field(default=None, max_length=64)
    tags: list[str] | None = Field(default=None, max_length=256)
    target_indexes: list[str] | None = Field(default=None, max_length=16)
    enable_chunking: bool = True
    enable_llm_analysis: bool | None = None
    llm_focus_areas: list[str] | None = Field(default=None, max_length=32)
    include_insights_in_response: bool = False
    timeout_seconds: float | None = Field(default=None, gt=0.0)
    targets: list[dict[str, Any]] | None = Field(default=None, max_length=16)
    namespace: Namespace | None = None
    galaxy: Name | None = None
    snapshot_kind: Name | None = None
    item_id: str | None = Field(default=None, min_length=1, max_length=512)
    revision: JsonInt | None = Field(
        default=None, ge=1, le=2**62, json_schema_extra={"minimum": 1, "maximum": 2**62}
    )
    payload_schema: str | None = Field(default=None, max_length=256)


class BulkRecordsRequest(_Strict):
    operation: Literal["store_payload"] = "store_payload"
    execution_mode: Literal["sync", "async"] = "sync"
    items: list[BulkRecordItem] = Field(min_length=1)
    timeout_seconds: float | None = Field(default=None, gt=0.0)
    client_request_id: str | None = Field(default=None, max_length=256)
    finalize_vector_segments: bool = True


class BulkItemOut(BaseModel):
    item_index: int
    success: bool
    status: int = Field(description="201 written, 409 stale revision")
    payload_id: str = Field(description="= document_id")
    document_id: str
    item_id: str
    snapshot_kind: str
    revision: int
    current_revision: int | None = None
    error: str | None = None


class BulkRecordsResponse(BaseModel):
    success: bool
    all_succeeded: bool
    operation: str = "store_payload"
    execution_mode: str
    count: int
    succeeded: int
    failed: int
    items: list[BulkItemOut]
    client_request_id: str | None = None


class JobAccepted(BaseModel):
    success: Literal[True] = True
    job_id: str
    status: Literal["accepted"] = "accepted"
    operation: str = "store_payload"
    execution_mode: Literal["async"] = "async"
    items: int
    client_request_id: str | None = None


class JobStatusResponse(BaseModel):
    success: Literal[True] = True
    job_id: str
    status: Literal["accepted", "running", "done", "failed"]
    items: int
    document_ids: list[str] = Field(default_factory=list)
    result: BulkRecordsResponse | None = None
    error: str | None = None
