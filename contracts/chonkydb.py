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

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.config import JsonDict

from contracts.names import Namespace
from contracts.records import AwareDatetime, Name, RecordMetadata
from contracts.topk import (
    LIMIT_FACT,
    MAX_ALLOWED_DOC_IDS,
    QueryFilters,
    QueryPlan,
    ScoreBreakdown,
)
from contracts.wire import JsonInt

__all__ = [
    "BY_ID_QUERY",
    "INDEX_WORDS",
    "KEPT_METADATA",
    "MAX_BY_ID",
    "MAX_KEPT_METADATA_BYTES",
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
    "IndexLanes",
    "InstanceResponse",
    "JobAccepted",
    "JobStatusResponse",
    "RecordListResponse",
    "RecordOut",
    "RecordSummary",
    "client_metadata",
    "index_lanes",
    "is_by_id_query",
    "is_dialect",
    "split_metadata",
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
# ChonkyDB's index names, word by word, as the Orrery lane each word means. ChonkyDB's
# router hands `allowed_indexes` / `target_indexes` to its engine unchecked, and its
# names come in several spellings (`fulltext`, `fulltext_index`,
# `ccodex_memory_fulltext`, `hnsw`, `ccodex_memory_vector_768`, `temporal_index`): a
# name is split into words on anything but letters, and each word looked up here.
# `lexical`: the BM25 index (title, body and tags are all in it, so `tags` is lexical);
# `vector`: the vector index; `filter`: a restriction Orrery applies in whichever lane
# ranks (`temporal_*`, `filters`); `None`: accepted, Orrery has nothing to do for it.
INDEX_WORDS: dict[str, str | None] = {
    "fulltext": "lexical",
    "bm25": "lexical",
    "lexical": "lexical",
    "keyword": "lexical",
    "tags": "lexical",
    "tag": "lexical",
    "vector": "vector",
    "vectors": "vector",
    "hnsw": "vector",
    "ann": "vector",
    "embedding": "vector",
    "embeddings": "vector",
    "semantic": "vector",
    "metadata": "filter",
    "temporal": "filter",
    "time": "filter",
    "facets": "filter",
    "filter": "filter",
    "graph": None,
}
_WORD = re.compile(r"[a-z0-9]+")


def index_lanes(name: str) -> frozenset[str] | None:
    """The lanes (`lexical`, `vector`, `filter`) one ChonkyDB index name means: empty
    for a name Orrery accepts with nothing to do (`graph`), None for a name none of
    whose words it knows (ChonkyDB passes such a name to its engine, which then uses no
    index of that name: Orrery ignores it and says so in `indexes_ignored`)."""
    words = [w for w in _WORD.findall(name.lower()) if w in INDEX_WORDS]
    if not words:
        return None
    return frozenset(lane for w in words if (lane := INDEX_WORDS[w]) is not None)


@dataclass(frozen=True, slots=True)
class IndexLanes:
    """What a list of ChonkyDB index names asks of Orrery: the search lanes named
    (`lexical`, `vector`), whether a filter lane was named, and the names that mean
    nothing Orrery does (unknown, or accepted with nothing to do)."""

    search: frozenset[str]
    filter: bool
    ignored: tuple[str, ...]

    @classmethod
    def of(cls, names: Sequence[str]) -> IndexLanes:
        search: set[str] = set()
        filtered = False
        ignored: list[str] = []
        for name in names:
            lanes = index_lanes(name)
            if not lanes:
                ignored.append(name)
                continue
            search |= lanes & {"lexical", "vector"}
            filtered = filtered or "filter" in lanes
        return cls(frozenset(search), filtered, tuple(ignored))


# ChonkyDB metadata is the client's, free-form. Orrery types some keys (`status`,
# `updated_at`, `visibility`) and wants the rest to be scalar facets with plain names;
# whatever does not fit is kept, as the client wrote it, in one facet holding its JSON
# and merged back into every answer's metadata.
KEPT_METADATA = "chonkydb_metadata"
# One facet value is one keyword term in the lexical engines (Lucene caps a term at
# 32,766 bytes): the kept part stays well under it.
MAX_KEPT_METADATA_BYTES = 16_384


def split_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """ChonkyDB item metadata as Orrery record metadata: each key Orrery can read as it
    stands (a typed field that parses, a facet with a valid name and scalar values) is
    mapped; the others are kept verbatim in `KEPT_METADATA` (JSON). Raises ValueError
    only when the kept part exceeds `MAX_KEPT_METADATA_BYTES`."""
    typed: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    for key, value in metadata.items():
        if key == KEPT_METADATA:
            kept[key] = value
            continue
        try:
            RecordMetadata.model_validate({key: value})
        except ValidationError:
            kept[key] = value
        else:
            typed[key] = value
    if kept:
        text = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        size = len(text.encode("utf-8"))
        if size > MAX_KEPT_METADATA_BYTES:
            raise ValueError(
                f"metadata Orrery keeps verbatim ({sorted(kept)}) is {size} bytes as JSON; "
                f"at most {MAX_KEPT_METADATA_BYTES}"
            )
        typed[KEPT_METADATA] = text
    return typed


def client_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Record metadata as the ChonkyDB client wrote it: the kept keys merged back over
    Orrery's (a key Orrery could not read comes back exactly as written)."""
    out = dict(metadata)
    kept = out.pop(KEPT_METADATA, None)
    if isinstance(kept, str):
        try:
            restored = json.loads(kept)
        except ValueError:
            restored = None
        if isinstance(restored, dict):
            out.update(restored)
        else:
            out[KEPT_METADATA] = kept
    return out


def is_by_id_query(query_text: str) -> bool:
    """Whether a query text with `allowed_doc_ids` asks for those records, not a
    ranking of them (`__allowed_doc_ids__`, or no text)."""
    return query_text.strip() in ("", BY_ID_QUERY)


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
    "ChonkyDB index names, read word by word (docs/chonkydb.md): 'fulltext', 'bm25', "
    "'lexical', 'tags' mean the lexical lane, 'vector', 'hnsw', 'embedding' the vector "
    "lane ('ccodex_memory_fulltext', 'ccodex_memory_vector_768' work); 'temporal', "
    "'metadata' are filters, applied in whichever lane ranks. When the names select "
    "one search lane the other is not searched (weight 0); both or neither: both. "
    "Names Orrery has nothing for ('graph', unknown ones) are ignored and listed in "
    "the answer's `indexes_ignored`, as ChonkyDB's router passes them on unchecked."
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
    allowed_indexes: list[Annotated[str, Field(max_length=128)]] | None = Field(
        default=None, max_length=32, description=_INDEXES_DESCRIPTION
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
    """ChonkyDB's `retrieve` request: ranked hits with metadata (no payloads). With
    `allowed_doc_ids` and `query_text` empty or `BY_ID_QUERY` it is the by-id call,
    answered exactly like `topk_records`'s (a `ChonkyTopKResponse`)."""

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
    indexes_used: list[str] = Field(
        description="The lanes that answered: Orrery's sources (`bm25`, `vector`, "
        "`metadata`, `filter`), `record_store` for the by-id call"
    )
    indexes_ignored: list[str] = Field(
        default_factory=list,
        description="`allowed_indexes` names Orrery has nothing for (unknown, `graph`)",
    )
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
    indexes_ignored: list[str] = Field(
        default_factory=list,
        description="`allowed_indexes` names Orrery has nothing for (unknown, `graph`)",
    )
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
    header_name: str = Field(
        default="x-api-key", description="The API-key header (`ORRERY_API_KEY_HEADER`)"
    )
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
    chunks: list[dict[str, Any]] | None = Field(
        default=None,
        description="With `include_chunks=true`: the record's chunks. Orrery does not "
        "split records, so there is one: `chunk_index` 0, the record's `content` (not "
        "truncated), `metadata` and `payload`",
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
