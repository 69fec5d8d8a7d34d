"""ChonkyDB's external read API over the query service (docs/chonkydb.md).

`chonky_topk` / `chonky_retrieve` answer ChonkyDB-shaped bodies on Orrery's own
`retrieve` paths (`query.entrypoints.http` picks the dialect by the body's fields) by
calling `topk_records` / `retrieve` and renaming; `create_router` adds the read routes
ChonkyDB has and Orrery had not: `instance`, `admin/auth`, `records` (list, get) and
`documents/full`.
No second store: every record comes from `QueryPorts.records`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import APIRouter, Header, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from contracts.auth import Access, ApiKeyGrant, authenticate, declare
from contracts.chonkydb import (
    MAX_BY_ID,
    AuthInfoResponse,
    ByIdPlan,
    ChonkyRetrieveHit,
    ChonkyRetrieveRequest,
    ChonkyRetrieveResponse,
    ChonkyTopKHit,
    ChonkyTopKRequest,
    ChonkyTopKResponse,
    IndexLanes,
    InstanceResponse,
    RecordListResponse,
    RecordOut,
    RecordSummary,
    client_metadata,
    is_by_id_query,
)
from contracts.errors import ErrorCode, OrreryError
from contracts.names import Namespace
from contracts.openapi import operation
from contracts.params import AS_BOOL, AS_INT
from contracts.records import DEFAULT_GALAXY, derive_document_id
from contracts.topk import (
    Include,
    QueryFilters,
    Ranking,
    RetrieveRequest,
    RetrieveResponse,
    TopKRequest,
)
from query.ports import StoredRecord
from query.scopes import ScopeRegistry
from query.service import Principal, QueryLimits, QueryPorts, retrieve, topk_records

__all__ = ["chonky_retrieve", "chonky_topk", "create_router"]

# What a hit says it came from: Orrery fuses both sources into one ranking.
_HYBRID = "hybrid"


def _namespace(body_namespace: str | None, who: Principal) -> str:
    namespace = body_namespace or who.namespace
    if namespace is None:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST, "namespace is required (or an API key bound to one)"
        )
    if who.namespace is not None and who.namespace != namespace:
        raise OrreryError(
            ErrorCode.FORBIDDEN,
            f"this API key may not read namespace {namespace!r}",
            {"namespace": namespace},
        )
    return namespace


def _read_namespace(query_namespace: str | None, who: Principal) -> str | None:
    """The namespace a record read looks in: `?namespace=`, else the key's, else (no API
    keys configured: an open instance, as ChonkyDB's facade is) every namespace."""
    if query_namespace is None and who.namespace is None:
        return None
    return _namespace(query_namespace, who)


def _filters(body: ChonkyTopKRequest | ChonkyRetrieveRequest) -> QueryFilters:
    update: dict[str, Any] = {}
    for field, value in (
        ("updated_after", body.temporal_start),
        ("updated_before", body.temporal_end),
    ):
        if value is None:
            continue
        if getattr(body.filters, field) is not None:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                f"give either temporal_{'start' if field == 'updated_after' else 'end'} "
                f"or filters.{field}, not both",
            )
        update[field] = value
    return body.filters.model_copy(update=update) if update else body.filters


def _lanes(allowed_indexes: list[str] | None) -> IndexLanes:
    return IndexLanes.of(allowed_indexes or [])


def _ranking(lanes: IndexLanes) -> Ranking:
    """The search lanes named as the sources ranked: a lane left out weighs 0 (and is
    not searched); both or neither named: both, with the profile's weights."""
    if lanes.search == {"lexical"}:
        return Ranking(vector_weight=0.0)
    if lanes.search == {"vector"}:
        return Ranking(lexical_weight=0.0)
    return Ranking()


def _scope_ref(scope_ref: str | None) -> str:
    if scope_ref is None:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "scope_ref is required to rank without allowed_doc_ids (e.g. "
            "'longterm:objects:current'): Orrery's indexes are per namespace and snapshot "
            "kind, so there is no instance-wide index to search",
        )
    return scope_ref


def _scope_of_ids(
    namespace: str, scope_ref: str | None, ids: list[str], who: Principal, ports: QueryPorts
) -> str | None:
    """The scope to rank `allowed_doc_ids` in: `scope_ref` when given, else the one scope
    ref (without fixed filters) of the snapshot kind the current ones among them have
    (within the key's galaxy: another galaxy's id counts like an unknown one). None when
    none of them is a current record (nothing to rank)."""
    if scope_ref is not None:
        return scope_ref
    # The kind column only: a record is never read in full to learn what it is (40 ids
    # of large records once cost +621 MiB here).
    rows = ports.records.head_facts(namespace, ids)
    kinds = sorted({r.snapshot_kind for r in rows if who.galaxy is None or r.galaxy == who.galaxy})
    if not kinds:
        return None
    if len(kinds) > 1:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"allowed_doc_ids span the snapshot kinds {kinds}: give scope_ref to say which "
            "scope to rank in",
            {"snapshot_kinds": kinds},
        )
    registry = ports.scopes.registry if ports.scopes is not None else ScopeRegistry()
    refs = [
        ref
        for ref, definition in registry.refs(namespace).items()
        if definition.snapshot_kind == kinds[0] and definition.filters is None
    ]
    if not refs:
        raise OrreryError(
            ErrorCode.UNKNOWN_SCOPE,
            f"no scope ref reads snapshot kind {kinds[0]!r} in namespace {namespace!r}; "
            "give scope_ref",
            {"snapshot_kind": kinds[0], "namespace": namespace},
        )
    # Built-in refs first (registry order), so the answer does not depend on set order.
    return refs[0]


def _metadata(row: StoredRecord, record: dict[str, Any]) -> dict[str, Any]:
    return {
        **client_metadata(record["metadata"]),
        "snapshot_kind": row.snapshot_kind,
        "twinr_snapshot_kind": row.snapshot_kind,
        "galaxy": row.galaxy,
        "revision": row.revision,
        "payload_sha256": row.payload_sha256,
    }


def _content(text: dict[str, Any], max_chars: int | None) -> dict[str, Any]:
    if max_chars is None:
        return text
    return {**text, "body": str(text.get("body", ""))[:max_chars]}


def _retrieve_native(
    body: ChonkyTopKRequest | ChonkyRetrieveRequest,
    namespace: str,
    scope_ref: str,
    principal: Principal,
    ports: QueryPorts,
    limits: QueryLimits,
) -> RetrieveResponse:
    """The dialect's ranked call as Orrery's own `retrieve` in `scope_ref`."""
    native = RetrieveRequest(
        namespace=namespace,
        scope_ref=scope_ref,
        query_text=body.query_text,
        limit=body.result_limit,
        filters=_filters(body),
        ranking=_ranking(_lanes(body.allowed_indexes)),
        allowed_doc_ids=body.allowed_doc_ids,
        timeout_seconds=body.timeout_seconds,
        client_request_id=body.client_request_id,
    )
    return retrieve(native, principal=principal, ports=ports, limits=limits)


def chonky_topk(
    body: ChonkyTopKRequest, *, principal: Principal, ports: QueryPorts, limits: QueryLimits
) -> ChonkyTopKResponse:
    """ChonkyDB's `topk_records`: ranked by `topk_records`; with `allowed_doc_ids` and
    the query `__allowed_doc_ids__` (or none), exactly those documents' current records
    (the by-id call); with `allowed_doc_ids` and a real query, ranked within them."""
    namespace = _namespace(body.namespace, principal)
    if body.allowed_doc_ids is not None:
        if is_by_id_query(body.query_text):
            return _by_id(body, namespace, principal, ports)
        return _ranked_within(body, namespace, principal, ports, limits)
    native = TopKRequest(
        namespace=namespace,
        scope_ref=_scope_ref(body.scope_ref),
        query_text=body.query_text,
        result_limit=body.result_limit,
        filters=_filters(body),
        ranking=_ranking(_lanes(body.allowed_indexes)),
        include=Include(metadata=body.include_metadata, content=body.include_content),
        timeout_seconds=body.timeout_seconds,
        client_request_id=body.client_request_id,
    )
    out = topk_records(native, principal=principal, ports=ports, limits=limits)
    hits = []
    for r in out.results:
        metadata = None
        if r.metadata is not None:
            metadata = {
                **client_metadata(r.metadata),
                "twinr_snapshot_kind": r.metadata.get("snapshot_kind"),
            }
        hits.append(
            ChonkyTopKHit(
                rank=r.rank,
                payload_id=r.document_id,
                document_id=r.document_id,
                item_id=r.item_id,
                revision=int(r.metadata["revision"]) if r.metadata else 0,
                payload_schema=r.payload_schema,
                score=r.score,
                relevance_score=r.score,
                source_index=_HYBRID,
                candidate_origin=_HYBRID,
                payload=r.payload,
                metadata=metadata,
                content=None if r.content is None else _content(r.content, body.max_content_chars),
                score_breakdown=r.score_breakdown,
            )
        )
    if out.results and out.results[0].metadata is None:
        # The revision is only in metadata; without it ask the store (top k only).
        rows = ports.records.heads(namespace, [h.document_id for h in hits])
        revisions = {row.document_id: row.revision for row in rows}
        hits = [h.model_copy(update={"revision": revisions.get(h.document_id, 0)}) for h in hits]
    return ChonkyTopKResponse(
        scope_ref=out.scope_ref,
        generation_id=out.generation_id,
        profile=out.profile,
        client_request_id=out.client_request_id,
        results=hits,
        indexes_used=[] if out.query_plan is None else out.query_plan.indexes_used,
        indexes_ignored=list(_lanes(body.allowed_indexes).ignored),
        query_plan=out.query_plan,
    )


def _ranked_within(
    body: ChonkyTopKRequest,
    namespace: str,
    principal: Principal,
    ports: QueryPorts,
    limits: QueryLimits,
) -> ChonkyTopKResponse:
    """`topk_records` ranked within `allowed_doc_ids` (Twinr's filtered catalog search):
    Orrery's `retrieve` with those ids, payloads read at the ranked revisions."""
    assert body.allowed_doc_ids is not None
    scope_ref = _scope_of_ids(namespace, body.scope_ref, body.allowed_doc_ids, principal, ports)
    if scope_ref is None:
        return ChonkyTopKResponse(
            scope_ref=body.scope_ref,
            client_request_id=body.client_request_id,
            results=[],
            indexes_used=[],
            indexes_ignored=list(_lanes(body.allowed_indexes).ignored),
        )
    out = _retrieve_native(body, namespace, scope_ref, principal, ports, limits)
    stored = ports.fetch_records(namespace, [(c.document_id, c.revision) for c in out.candidates])
    hits = []
    for c in out.candidates:
        row = stored.get((c.document_id, c.revision))
        if row is None:
            raise OrreryError(
                ErrorCode.COVERAGE_UNAVAILABLE,
                f"document {c.document_id} revision {c.revision} is indexed but missing "
                "from the record store",
                {"generation_id": out.generation_id},
            )
        record = json.loads(row.record_json)
        hits.append(
            ChonkyTopKHit(
                rank=c.rank,
                payload_id=c.document_id,
                document_id=c.document_id,
                item_id=row.item_id,
                revision=c.revision,
                payload_schema=record.get("payload_schema", ""),
                score=c.score,
                relevance_score=c.score,
                source_index=_HYBRID,
                candidate_origin=_HYBRID,
                payload=record["payload"],
                metadata=_metadata(row, record) if body.include_metadata else None,
                content=_content(record["text"], body.max_content_chars)
                if body.include_content
                else None,
                score_breakdown=c.score_breakdown,
            )
        )
    return ChonkyTopKResponse(
        scope_ref=out.scope_ref,
        generation_id=out.generation_id,
        profile=out.profile,
        client_request_id=body.client_request_id,
        results=hits,
        indexes_used=out.query_plan.indexes_used,
        indexes_ignored=list(_lanes(body.allowed_indexes).ignored),
        query_plan=out.query_plan,
    )


def _by_id(
    body: ChonkyTopKRequest | ChonkyRetrieveRequest,
    namespace: str,
    principal: Principal,
    ports: QueryPorts,
) -> ChonkyTopKResponse:
    """The by-id call (topk_records' and retrieve's): those documents' current records
    in the order asked, exactly, from the record store; no index is searched."""
    started = time.perf_counter()
    assert body.allowed_doc_ids is not None
    if len(body.allowed_doc_ids) > MAX_BY_ID:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"the by-id call takes at most {MAX_BY_ID} allowed_doc_ids, got "
            f"{len(body.allowed_doc_ids)}",
            {"max_by_id": MAX_BY_ID},
        )
    galaxy = principal.galaxy
    if body.filters.galaxy is not None:
        if galaxy is not None and body.filters.galaxy != galaxy:
            raise OrreryError(
                ErrorCode.FORBIDDEN,
                f"this API key is limited to galaxy {galaxy!r}",
                {"galaxy": body.filters.galaxy},
            )
        galaxy = body.filters.galaxy
    wanted = list(dict.fromkeys(body.allowed_doc_ids))[: min(body.result_limit, MAX_BY_ID)]
    # Another galaxy's records are left out before any is read (bounded answer: the
    # reader refuses past ORRERY_MAX_ANSWER_BYTES with 413 answer_too_large).
    facts = ports.records.head_facts(namespace, wanted)
    mine = {f.document_id for f in facts if galaxy is None or f.galaxy == galaxy}
    rows = {
        r.document_id: r for r in ports.records.heads(namespace, [d for d in wanted if d in mine])
    }
    hits: list[ChonkyTopKHit] = []
    for doc_id in wanted:
        row = rows.get(doc_id)
        # Another galaxy's document answers like an unknown id: absent.
        if row is None or (galaxy is not None and row.galaxy != galaxy):
            continue
        record = json.loads(row.record_json)
        hits.append(
            ChonkyTopKHit(
                rank=len(hits) + 1,
                payload_id=row.document_id,
                document_id=row.document_id,
                item_id=row.item_id,
                revision=row.revision,
                payload_schema=record.get("payload_schema", ""),
                score=1.0,
                relevance_score=1.0,
                source_index="record_store",
                candidate_origin="allowed_doc_ids",
                payload=record["payload"],
                metadata=_metadata(row, record) if body.include_metadata else None,
                content=_content(record["text"], body.max_content_chars)
                if body.include_content
                else None,
            )
        )
    elapsed = round((time.perf_counter() - started) * 1000.0, 3)
    return ChonkyTopKResponse(
        scope_ref=body.scope_ref,
        client_request_id=body.client_request_id,
        results=hits,
        indexes_used=["record_store"],
        indexes_ignored=list(_lanes(body.allowed_indexes).ignored),
        query_plan=ByIdPlan(
            requested=len(wanted),
            found=len(hits),
            indexes_used=["record_store"],
            latency_ms={"payload_materialize": elapsed, "total": elapsed},
        ),
    )


def chonky_retrieve(
    body: ChonkyRetrieveRequest, *, principal: Principal, ports: QueryPorts, limits: QueryLimits
) -> ChonkyRetrieveResponse | ChonkyTopKResponse:
    """ChonkyDB's `retrieve`: Orrery's `retrieve`, hits renamed, metadata read from the
    record store at the ranked revisions when asked for (top k only). With
    `allowed_doc_ids` and the query `__allowed_doc_ids__` (or none): the by-id call,
    answered as `topk_records` answers it (payloads included)."""
    namespace = _namespace(body.namespace, principal)
    if body.allowed_doc_ids is not None and is_by_id_query(body.query_text):
        return _by_id(body, namespace, principal, ports)
    if body.allowed_doc_ids is None:
        scope_ref: str | None = _scope_ref(body.scope_ref)
    else:
        scope_ref = _scope_of_ids(namespace, body.scope_ref, body.allowed_doc_ids, principal, ports)
    if scope_ref is None:
        return ChonkyRetrieveResponse(
            scope_ref=body.scope_ref,
            generation_id=None,
            profile=None,
            results=[],
            indexes_used=[],
            indexes_ignored=list(_lanes(body.allowed_indexes).ignored),
            query_plan=None,
        )
    out = _retrieve_native(body, namespace, scope_ref, principal, ports, limits)
    stored = (
        ports.fetch_records(namespace, [(c.document_id, c.revision) for c in out.candidates])
        if body.include_metadata
        else {}
    )
    hits = []
    for c in out.candidates:
        row = stored.get((c.document_id, c.revision))
        hits.append(
            ChonkyRetrieveHit(
                rank=c.rank,
                payload_id=c.document_id,
                document_id=c.document_id,
                revision=c.revision,
                score=c.score,
                relevance_score=c.score,
                source_index=_HYBRID,
                candidate_origin=_HYBRID,
                metadata=None if row is None else _metadata(row, json.loads(row.record_json)),
                score_breakdown=c.score_breakdown,
            )
        )
    return ChonkyRetrieveResponse(
        scope_ref=out.scope_ref,
        generation_id=out.generation_id,
        profile=out.profile,
        results=hits,
        indexes_used=out.query_plan.indexes_used,
        indexes_ignored=list(_lanes(body.allowed_indexes).ignored),
        query_plan=out.query_plan,
    )


def _record_out(
    row: StoredRecord, include_content: bool, max_chars: int, include_chunks: bool = False
) -> RecordOut:
    record = json.loads(row.record_json)
    text = record["text"]
    content = "\n".join(p for p in (text.get("title", ""), text.get("body", "")) if p)
    metadata = _metadata(row, record)
    chunks = None
    if include_chunks:
        chunks = [
            {
                "chunk_index": 0,
                "document_id": row.document_id,
                "content": content,
                "metadata": metadata,
                "payload": record["payload"],
            }
        ]
    return RecordOut(
        chunks=chunks,
        payload_id=row.document_id,
        chonky_id=row.document_id,
        document_id=row.document_id,
        item_id=row.item_id,
        snapshot_kind=row.snapshot_kind,
        revision=row.revision,
        payload_schema=record.get("payload_schema", ""),
        payload=record["payload"],
        metadata=metadata,
        content=content[:max_chars] if include_content else None,
        origin_uri=_origin_uri(record["metadata"]),
    )


def _origin_uri(metadata: dict[str, Any]) -> str | None:
    value = metadata.get("origin_uri")
    return value if isinstance(value, str) else None


def create_router(
    *,
    ports: QueryPorts,
    grants: dict[str, ApiKeyGrant],
    ready: Callable[[ApiKeyGrant | None], bool],
    api_key_header: str = "x-api-key",
) -> APIRouter:
    """ChonkyDB's read routes Orrery's own API has no counterpart of. `ready(grant)`:
    whether the key's view of readiness is ready (`query.entrypoints.http.readiness`)."""
    router = APIRouter()

    def principal(x_api_key: str | None, authorization: str | None) -> Principal:
        grant = authenticate(grants, x_api_key, authorization)
        return Principal() if grant is None else Principal(grant.namespace, grant.galaxy)

    def one(namespace: str | None, document_id: str, who: Principal) -> StoredRecord:
        rows = ports.records.heads(namespace, [document_id])
        row = next(iter(rows), None)
        # Another galaxy's (or namespace's) document answers exactly like an unknown id.
        if row is None or (who.galaxy is not None and row.galaxy != who.galaxy):
            raise OrreryError(ErrorCode.NOT_FOUND, f"no record {document_id!r}")
        return row

    @router.get(
        "/v1/external/instance",
        tags=["chonkydb"],
        openapi_extra={**declare(Access.OPS), **operation(ok=InstanceResponse)},
    )
    async def get_instance(
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """ChonkyDB's instance overview: `ready` is `/v1/readiness`'s answer for this key."""
        grant = authenticate(grants, x_api_key, authorization)
        is_ready = await run_in_threadpool(ready, grant)
        out = InstanceResponse(ready=is_ready, auth_enabled=bool(grants))
        return JSONResponse(out.model_dump(mode="json"))

    @router.get(
        "/v1/external/admin/auth",
        tags=["chonkydb"],
        openapi_extra={**declare(Access.OPS), **operation(ok=AuthInfoResponse)},
    )
    async def get_auth_info(
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """ChonkyDB's auth overview: keys in `header_name` (`ORRERY_API_KEY_HEADER`,
        default `x-api-key`) or `Authorization: Bearer`."""
        authenticate(grants, x_api_key, authorization)
        out = AuthInfoResponse(
            auth_enabled=bool(grants),
            header_name=api_key_header,
            api_key_configured=bool(grants),
        )
        return JSONResponse(out.model_dump(mode="json"))

    @router.get(
        "/v1/external/records",
        tags=["chonkydb"],
        openapi_extra={**declare(Access.READ), **operation(ok=RecordListResponse)},
    )
    async def list_records(
        offset: Annotated[int, Query(ge=0, le=10_000_000), AS_INT] = 0,
        limit: Annotated[int, Query(ge=1, le=1_000), AS_INT] = 100,
        include_metadata: Annotated[bool, Query(), AS_BOOL] = True,
        namespace: Namespace | None = Query(default=None),
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """The current records of the key's namespace (or `namespace`; without API keys
        and `namespace`, of every namespace), by document id."""
        who = principal(x_api_key, authorization)
        ns = _read_namespace(namespace, who)
        total, rows = await run_in_threadpool(ports.records.page, ns, who.galaxy, offset, limit)
        payloads = []
        for row in rows:
            metadata = _metadata(row, json.loads(row.record_json)) if include_metadata else None
            payloads.append(
                RecordSummary(
                    payload_id=row.document_id,
                    chonky_id=row.document_id,
                    document_id=row.document_id,
                    item_id=row.item_id,
                    snapshot_kind=row.snapshot_kind,
                    revision=row.revision,
                    metadata=metadata,
                )
            )
        out = RecordListResponse(
            namespace=ns,
            offset=offset,
            limit=limit,
            total_count=total,
            returned_count=len(payloads),
            payloads=payloads,
        )
        return JSONResponse(out.model_dump(mode="json"))

    @router.get(
        "/v1/external/records/{record_id}",
        tags=["chonkydb"],
        openapi_extra={**declare(Access.READ), **operation(ok=RecordOut)},
    )
    async def get_record(
        record_id: str,
        by: str = Query(default="payload", pattern="^(payload|chonky)$"),
        include_chunks: Annotated[bool, Query(), AS_BOOL] = False,
        include_relationships: Annotated[bool, Query(), AS_BOOL] = False,
        include_document: Annotated[bool, Query(), AS_BOOL] = False,
        include_content: Annotated[bool, Query(), AS_BOOL] = True,
        max_content_chars: Annotated[int, Query(ge=0, le=2_000_000), AS_INT] = 4_000,
        namespace: Namespace | None = Query(default=None),
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """One current record by id (`payload` and `chonky` ids are both the document
        id; `include_chunks` adds its one chunk, relationships are none; `include_document` adds
        `document`, the record as `documents/full` answers it)."""
        who = principal(x_api_key, authorization)
        ns = _read_namespace(namespace, who)
        row = await run_in_threadpool(one, ns, record_id, who)
        out = _record_out(row, include_content, max_content_chars, include_chunks)
        if include_document:
            out = out.model_copy(update={"document": out.model_copy()})
        return JSONResponse(out.model_dump(mode="json"))

    @router.get(
        "/v1/external/documents/full",
        tags=["chonkydb"],
        openapi_extra={**declare(Access.READ), **operation(ok=RecordOut)},
    )
    async def get_full_document(
        document_id: str | None = Query(default=None, min_length=1, max_length=256),
        origin_uri: str | None = Query(default=None, min_length=1, max_length=512),
        snapshot_kind: str | None = Query(default=None, min_length=1, max_length=128),
        include_content: Annotated[bool, Query(), AS_BOOL] = True,
        include_chunks: Annotated[bool, Query(), AS_BOOL] = False,
        max_content_chars: Annotated[int, Query(ge=0, le=2_000_000), AS_INT] = 4_000,
        namespace: Namespace | None = Query(default=None),
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """A record by `document_id`, or by the `origin_uri` it was written with (its
        item id; the snapshot kind from `snapshot_kind` or a `twinr://longterm/` uri)."""
        who = principal(x_api_key, authorization)
        ns = _read_namespace(namespace, who)
        if document_id is None:
            document_id = _id_of_uri(ns, origin_uri, snapshot_kind, who)
        row = await run_in_threadpool(one, ns, document_id, who)
        out = _record_out(row, include_content, max_content_chars, include_chunks)
        return JSONResponse(out.model_dump(mode="json"))

    return router


def _id_of_uri(namespace: str | None, uri: str | None, kind: str | None, who: Principal) -> str:
    if uri is None:
        # A lookup that names no document finds none (the schema cannot say "one of
        # two parameters", so this is no malformed request).
        raise OrreryError(ErrorCode.NOT_FOUND, "no record: give document_id or origin_uri")
    if uri.startswith("twinr://longterm/"):
        parts = uri[len("twinr://longterm/") :].split("/")
        if kind is None:
            kind = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
        if namespace is None:
            namespace = unquote(parts[0]) or None
    if namespace is None:
        raise OrreryError(
            ErrorCode.NOT_FOUND,
            f"no record for origin_uri {uri[:200]!r} without a namespace (give namespace "
            "or a twinr://longterm/<namespace>/… uri)",
        )
    if kind is None:
        raise OrreryError(
            ErrorCode.NOT_FOUND,
            f"no record for origin_uri {uri[:200]!r} without a snapshot kind (give "
            "snapshot_kind or a twinr:// uri)",
        )
    return derive_document_id(namespace, kind, uri, who.galaxy or DEFAULT_GALAXY)
