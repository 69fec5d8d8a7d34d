"""ChonkyDB's external write API over ingest: `POST /v1/external/records/bulk` (sync, and
async with `GET /v1/external/jobs/{job_id}`) and `DELETE /v1/external/records/{id}`.

Thin: each ChonkyDB item becomes one Orrery record (identity and field mapping in
docs/chonkydb.md), validated by `ingest.service.parse_batch` and written by
`write_records` like `POST /v1/records`; async jobs are kept in a `JobStore` (SQLite file or
PostgreSQL table) that every worker shares.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from contracts.auth import Access, ApiKeyGrant, authenticate, declare, sees
from contracts.chonkydb import (
    BulkItemOut,
    BulkRecordItem,
    BulkRecordsRequest,
    BulkRecordsResponse,
    DeleteRecordResponse,
    IndexLanes,
    JobAccepted,
    JobStatusResponse,
    split_metadata,
)
from contracts.errors import ErrorCode, OrreryError
from contracts.openapi import operation
from contracts.records import DEFAULT_GALAXY, derive_document_id
from contracts.wire import loads_strict, validate_strict
from ingest.model import strings_in
from ingest.pacing import WritePacer
from ingest.ports import Head, Job, JobStore, RecordStore
from ingest.service import check_batch_size, parse_batch, write_records

__all__ = ["JOB_HISTORY", "JOB_LEASE_SECONDS", "create_router", "to_record"]

log = logging.getLogger(__name__)

# Jobs kept per namespace (tenant) for `GET jobs/{id}`, its oldest dropped first.
JOB_HISTORY = 1_024
_TWINR_URI = "twinr://longterm/"
# Metadata keys that carry identity or the payload, not facets.
_CONSUMED = ("twinr_namespace", "twinr_snapshot_kind", "twinr_payload")


def _uri_parts(uri: str | None) -> tuple[str | None, str | None]:
    """(namespace, snapshot kind) of a `twinr://longterm/<namespace>/<kind>/…` uri."""
    if uri is None or not uri.startswith(_TWINR_URI):
        return None, None
    parts = uri[len(_TWINR_URI) :].split("/")
    namespace = unquote(parts[0]) or None
    kind = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
    return namespace, kind


def to_record(item: BulkRecordItem, grant: ApiKeyGrant | None) -> dict[str, Any]:
    """One ChonkyDB item as the JSON of an Orrery record (revision not set yet).

    Raises `invalid_request` naming what is missing when the identity cannot be made.
    """
    metadata = dict(item.metadata or {})
    uri_namespace, uri_kind = _uri_parts(item.uri)
    namespace = (
        item.namespace
        or _str(metadata.get("twinr_namespace"))
        or uri_namespace
        or (None if grant is None else grant.namespace)
    )
    kind = item.snapshot_kind or _str(metadata.get("twinr_snapshot_kind")) or uri_kind
    payload = item.payload
    if payload is None and isinstance(metadata.get("twinr_payload"), dict):
        payload = metadata["twinr_payload"]
    payload = payload or {}
    item_id = item.item_id or item.uri or _str(payload.get("memory_id"))
    missing = [
        name
        for name, value in (("namespace", namespace), ("snapshot_kind", kind), ("item_id", item_id))
        if value is None
    ]
    if missing:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"the item has no {', '.join(missing)} (docs/chonkydb.md: record identity)",
            {"missing": missing},
        )
    for key in _CONSUMED:
        metadata.pop(key, None)
    if item.uri is not None:
        metadata.setdefault("origin_uri", item.uri)
    try:
        metadata = split_metadata(metadata)
    except ValueError as exc:
        raise OrreryError(ErrorCode.INVALID_REQUEST, f"metadata: {exc}") from exc
    body = item.content if item.content is not None else "\n".join(strings_in(payload))
    return {
        "namespace": namespace,
        "galaxy": item.galaxy
        or (grant.galaxy if grant is not None and grant.galaxy else DEFAULT_GALAXY),
        "snapshot_kind": kind,
        "item_id": item_id,
        "payload_schema": item.payload_schema or _str(payload.get("schema")) or "",
        "payload": payload,
        "text": {"body": body, "tags": list(item.tags or [])},
        "metadata": metadata,
        **({"revision": item.revision} if item.revision is not None else {}),
        **_lanes(item.target_indexes),
    }


def _lanes(target_indexes: list[str] | None) -> dict[str, Any]:
    """`target_indexes` as the record's `index_lanes`: absent = every lane; `[]` (or
    names of no search lane) = none, the record is stored but never a search hit."""
    if target_indexes is None:
        return {}
    return {"index_lanes": sorted(IndexLanes.of(target_indexes).search)}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# A job still `accepted` or `running` this long after its last change has lost the
# worker that accepted it (a write takes seconds): it is reported `failed`.
JOB_LEASE_SECONDS = 600.0


def _owner(grant: ApiKeyGrant | None) -> str:
    """Who may read a job: the reach of the key that wrote it (`""`: no API keys)."""
    if grant is None:
        return ""
    return f"{grant.namespace}\x1f{grant.galaxy or ''}"


class _Jobs:
    """Async bulk writes: state in the shared `JobStore` (any worker answers), work on
    a thread of the worker that accepted them, the last `JOB_HISTORY` per tenant kept."""

    def __init__(self, store: JobStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    def start(
        self,
        tenant: str,
        grant: ApiKeyGrant | None,
        items: int,
        work: Callable[[], BulkRecordsResponse],
    ) -> str:
        job = Job(
            job_id=f"job-{uuid.uuid4().hex}",
            tenant=tenant,
            owner=_owner(grant),
            status="accepted",
            items=items,
            updated_at=self._clock(),
        )
        self._store.put(job, history=JOB_HISTORY)

        def run() -> None:
            state = replace(job, status="running", updated_at=self._clock())
            try:
                self._store.finish(state)
                result = work()
                state = replace(
                    state,
                    status="done",
                    result=result.model_dump(mode="json"),
                    document_ids=tuple(i.document_id for i in result.items if i.success),
                )
            except OrreryError as exc:
                state = replace(state, status="failed", error=f"{exc.code.value}: {exc.message}")
            except Exception as exc:  # a job must end in a state, never vanish
                state = replace(state, status="failed", error=f"internal: {type(exc).__name__}")
            try:
                self._store.finish(replace(state, updated_at=self._clock()))
            except OrreryError:
                log.exception("job %s: its final state could not be stored", job.job_id)

        threading.Thread(target=run, name=f"orrery-{job.job_id}", daemon=True).start()
        return job.job_id

    def get(self, job_id: str) -> Job | None:
        job = self._store.get(job_id)
        if (
            job is not None
            and job.status in ("accepted", "running")
            and self._clock() - job.updated_at > JOB_LEASE_SECONDS
        ):
            return replace(
                job,
                status="failed",
                error="worker_lost: the worker that accepted this job stopped before it "
                "finished; records it wrote are in the store (GET /v1/external/records/{id})",
            )
        return job


def _tenant(grant: ApiKeyGrant | None, records: Sequence[Any]) -> str:
    """The namespace a batch writes to (`""` for several: only without API keys)."""
    if grant is not None:
        return grant.namespace
    namespaces = {r.namespace for r in records}
    return namespaces.pop() if len(namespaces) == 1 else ""


def create_router(
    *,
    store: RecordStore,
    jobs: JobStore,
    grants: dict[str, ApiKeyGrant],
    max_batch: int,
    vector_dimension: int | None,
    max_record_bytes: int,
    on_commit: Callable[[], None] | None = None,
    pacer: WritePacer | None = None,
) -> APIRouter:
    """ChonkyDB's write routes over `store` (the same store `POST /v1/records` uses),
    paced by `pacer` like `POST /v1/records` (`ingest.pacing`); async jobs in `jobs`
    (shared by every worker on the same database)."""
    router = APIRouter()
    pacer = pacer or WritePacer(None)
    job_table = _Jobs(jobs)

    def prepare(body: BulkRecordsRequest, grant: ApiKeyGrant | None) -> list[Any]:
        raws = [to_record(item, grant) for item in body.items]
        ids = [
            derive_document_id(r["namespace"], r["snapshot_kind"], r["item_id"], r["galaxy"])
            for r in raws
        ]
        heads = {h.document_id: h for h in store.heads(ids)}
        for raw, doc_id in zip(raws, ids, strict=True):
            if "revision" not in raw:
                head = heads.get(doc_id)
                raw["revision"] = 1 if head is None else head.revision + 1
        return parse_batch(
            raws,
            max_batch=max_batch,
            vector_dimension=vector_dimension,
            max_record_bytes=max_record_bytes,
            allowed_namespace=None if grant is None else grant.namespace,
            allowed_galaxy=None if grant is None else grant.galaxy,
        )

    def write(records: Sequence[Any], body: BulkRecordsRequest) -> BulkRecordsResponse:
        result = write_records(records, store=store, on_commit=on_commit)
        items = []
        for out, record in zip(result.items, records, strict=True):
            ok = out.status == 201
            items.append(
                BulkItemOut(
                    item_index=out.index,
                    success=ok,
                    status=out.status,
                    payload_id=out.document_id,
                    document_id=out.document_id,
                    item_id=record.item_id,
                    snapshot_kind=record.snapshot_kind,
                    revision=out.revision,
                    current_revision=None
                    if ok or out.error is None
                    else out.error.details.get("current_revision"),
                    error=None if ok or out.error is None else out.error.message,
                )
            )
        succeeded = sum(1 for i in items if i.success)
        return BulkRecordsResponse(
            success=succeeded == len(items),
            all_succeeded=succeeded == len(items),
            execution_mode=body.execution_mode,
            count=len(items),
            succeeded=succeeded,
            failed=len(items) - succeeded,
            items=items,
            client_request_id=body.client_request_id,
        )

    @router.post(
        "/v1/external/records/bulk",
        tags=["chonkydb"],
        openapi_extra={
            **declare(Access.WRITE),
            **operation(body=BulkRecordsRequest, ok=BulkRecordsResponse, accepted=JobAccepted),
        },
    )
    async def post_records_bulk(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """ChonkyDB's bulk write. `sync`: 200 with per-item outcomes (409 when no item was
        written); `async`: 202 with a job id once the batch is valid (`GET jobs/{id}`)."""
        grant = authenticate(grants, x_api_key, authorization)
        body = validate_strict(loads_strict(await request.body()), BulkRecordsRequest)
        check_batch_size(len(body.items), max_batch)  # before any store read
        records = await run_in_threadpool(prepare, body, grant)
        namespaces = {r.namespace for r in records}
        if body.execution_mode == "async":
            # Accepted only once the namespaces are within their backlog bound (the job
            # then writes on its own thread, without holding them).
            async with pacer.admitted(namespaces):
                pass
            job_id = await run_in_threadpool(
                job_table.start,
                _tenant(grant, records),
                grant,
                len(records),
                lambda: write(records, body),
            )
            accepted = JobAccepted(
                job_id=job_id, items=len(records), client_request_id=body.client_request_id
            )
            return JSONResponse(accepted.model_dump(mode="json"), status_code=202)
        async with pacer.admitted(namespaces):
            result = await run_in_threadpool(write, records, body)
        if result.succeeded == 0:
            raise OrreryError(
                ErrorCode.REVISION_CONFLICT,
                "no item was written: every revision is stale",
                result.model_dump(mode="json"),
            )
        return JSONResponse(result.model_dump(mode="json"))

    @router.get(
        "/v1/external/jobs/{job_id}",
        tags=["chonkydb"],
        openapi_extra={**declare(Access.WRITE), **operation(ok=JobStatusResponse)},
    )
    async def get_job(
        job_id: str,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """An async bulk write's state: accepted → running → done (with the written
        document ids) or failed. Any worker on the same database answers; finished jobs
        outlive restarts (the last `JOB_HISTORY` per namespace). An unknown job, one
        pushed out of its namespace's history, and another key's are `404 unknown_job`."""
        grant = authenticate(grants, x_api_key, authorization)
        job = await run_in_threadpool(job_table.get, job_id)
        if job is None or (grant is not None and job.owner != _owner(grant)):
            raise OrreryError(
                ErrorCode.UNKNOWN_JOB,
                f"no job {job_id!r}: jobs are kept for the last {JOB_HISTORY} async bulk "
                "writes of each namespace; the records a finished job wrote are in the "
                "store (GET /v1/external/records/{id})",
                {"job_id": job_id},
            )
        out = JobStatusResponse(
            job_id=job_id,
            status=job.status,
            items=job.items,
            document_ids=list(job.document_ids),
            result=None if job.result is None else BulkRecordsResponse.model_validate(job.result),
            error=job.error,
        )
        return JSONResponse(out.model_dump(mode="json"))

    @router.delete(
        "/v1/external/records/{record_id}",
        tags=["chonkydb"],
        openapi_extra={**declare(Access.WRITE), **operation(ok=DeleteRecordResponse)},
    )
    async def delete_record(
        record_id: str,
        by: str = Query(default="payload", pattern="^(payload|chonky)$"),
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Delete a record by its id (`payload_id` = `chonky_id` = `document_id`): a
        tombstone one revision above the stored one. An id outside the key's reach, or
        already deleted, is 404 like an unknown one."""
        grant = authenticate(grants, x_api_key, authorization)
        heads = await run_in_threadpool(store.heads, [record_id])
        head: Head | None = next(iter(heads), None)
        if head is None or head.deleted or not sees(grant, head.namespace, head.galaxy):
            raise OrreryError(ErrorCode.NOT_FOUND, f"no record {record_id!r}")
        tombstone = {
            "namespace": head.namespace,
            "galaxy": head.galaxy,
            "snapshot_kind": head.snapshot_kind,
            "item_id": head.item_id,
            "revision": head.revision + 1,
            "deleted": True,
        }
        records = parse_batch(
            [tombstone],
            max_batch=1,
            vector_dimension=None,
            max_record_bytes=max_record_bytes,
            allowed_namespace=None if grant is None else grant.namespace,
            allowed_galaxy=None if grant is None else grant.galaxy,
        )
        async with pacer.admitted([head.namespace]):
            result = await run_in_threadpool(
                write_records, records, store=store, on_commit=on_commit
            )
        if result.accepted == 0:
            raise OrreryError(
                ErrorCode.REVISION_CONFLICT, "the record changed meanwhile; retry the delete"
            )
        out = DeleteRecordResponse(
            payload_id=head.document_id, document_id=head.document_id, revision=head.revision + 1
        )
        return JSONResponse(out.model_dump(mode="json"))

    return router
