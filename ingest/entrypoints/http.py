"""HTTP routes of ingest: `POST /v1/records`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from contracts.auth import Access, ApiKeyGrant, authenticate, declare
from contracts.errors import ErrorCode, OrreryError
from contracts.events import LogEntry
from contracts.ingest_api import WriteRequest, WriteResponse
from contracts.openapi import operation
from contracts.request_context import current_traceparent
from ingest.pacing import WAIT_POLL_SECONDS, WriteFlow, WritePacer
from ingest.ports import RecordStore
from ingest.service import Admitted, all_stale_body, parse_body, write_records
from ingest.write_workers import WriteWorkers

__all__ = ["WAIT_POLL_SECONDS", "WriteFlow", "create_router"]


def create_router(
    *,
    store: RecordStore,
    grants: dict[str, ApiKeyGrant],
    max_batch: int,
    vector_dimension: int | None,
    max_record_bytes: int,
    on_commit: Callable[[], None] | None = None,
    flow: WriteFlow | None = None,
    pacer: WritePacer | None = None,
    workers: WriteWorkers | None = None,
    on_events: Callable[[list[tuple[str, int]]], None] | None = None,
    on_committed: Callable[[list[LogEntry]], None] | None = None,
    expecting: Callable[[list[str]], AbstractContextManager[None]] | None = None,
) -> APIRouter:
    """`POST /v1/records`. With a `flow` (the embedded deployment), writers are paced
    per namespace by `pacer` (`ingest.pacing`: shared with the other write routes of the
    process; default: one of its own), and `?wait=searchable` is available; without
    one, `?wait=searchable` is `422 invalid_request`. With `workers`, a batch is parsed,
    validated and written in a worker process (`ingest.write_workers`: the same answers)
    and `on_events` gets each written batch's `(namespace, position)` events, then
    `on_committed` its outbox events (what `store` reports itself when it writes in
    this process), `expecting(namespaces)` held from before the worker's write until
    then (the projector's log waits for a hand-over it knows is coming, of those
    namespaces)."""
    router = APIRouter()
    pacer = pacer or WritePacer(flow)

    @router.post(
        "/v1/records",
        tags=["ingest"],
        openapi_extra={
            **declare(Access.WRITE),
            **operation(body=WriteRequest, ok=WriteResponse),
        },
    )
    async def post_records(
        request: Request,
        wait: Literal["searchable"] | None = Query(
            default=None,
            description="searchable: answer once every accepted record is searchable "
            "(or the wait ran out: `searchable` false). Embedded deployment only.",
        ),
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """Write a batch of records (upserts and tombstones) in one transaction.

        200 with per-record statuses (201 accepted, 409 stale revision); 409 when no
        record was accepted; 4xx with nothing written when any record is invalid; 503
        `ingest_backlog` (with Retry-After) with nothing written when the indexes stayed
        too far behind (embedded).
        """
        grant = authenticate(grants, x_api_key, authorization)
        if wait is not None and flow is None:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                "wait=searchable needs the embedded deployment (this process does not "
                "run the projector): poll GET /v1/readiness instead",
            )
        raw = await request.body()
        if workers is not None:
            return await _post_through(workers, raw, grant, wait)

        def parse() -> Admitted:
            return parse_body(
                raw,
                max_batch=max_batch,
                vector_dimension=vector_dimension,
                max_record_bytes=max_record_bytes,
                allowed_namespace=None if grant is None else grant.namespace,
                allowed_galaxy=None if grant is None else grant.galaxy,
            )

        # Parsing a batch of vectors takes tens of ms: off the event loop, which keeps
        # answering queries meanwhile (and before admission: it overlaps the projector).
        batch = await run_in_threadpool(parse)
        records = batch.records
        # Held from the backlog check through the write: the bound holds for concurrent
        # writers too (the store serializes their transactions anyway).
        async with pacer.admitted(r.namespace for r in records):
            result = await run_in_threadpool(
                write_records,
                records,
                store=store,
                on_commit=on_commit,
                stored_json=batch.stored_json,
            )
        if wait == "searchable" and flow is not None:
            result.searchable = await _until_searchable(flow, result)
        if result.accepted == 0:
            body = all_stale_body(result)
            return JSONResponse(body, status_code=409)
        # Serialized by pydantic in one call: a batch's response holds an item per record.
        return Response(
            # `searchable` only when asked for: other answers keep their shape.
            result.model_dump_json(exclude={"searchable"} if result.searchable is None else None),
            status_code=200,
            media_type="application/json",
        )

    async def _post_through(
        workers: WriteWorkers, raw: bytes, grant: ApiKeyGrant | None, wait: str | None
    ) -> Response:
        batch = await workers.parse(
            raw,
            allowed_namespace=None if grant is None else grant.namespace,
            allowed_galaxy=None if grant is None else grant.galaxy,
        )
        written = None
        try:
            async with pacer.admitted(batch.namespaces):
                with expecting(batch.namespaces) if expecting is not None else nullcontext():
                    written = await workers.write(batch, traceparent=current_traceparent())
                    # Counted before the namespace is let go: the next writer's backlog
                    # check sees this batch (as when the store reports it in process).
                    if written.events and on_events is not None:
                        on_events(written.events)
                    if on_committed is not None:
                        # Chunk by chunk: the projector waits for these events (a
                        # caught-up one fetched their positions at the worker's commit)
                        # and starts on the first while the rest are unpickled.
                        async for entries in written.handed_over():
                            on_committed(entries)
        finally:
            if written is None:
                # Refused (backlog) or cancelled: the worker lets the batch go.
                workers.let_go(batch)
        if written.events and on_commit is not None:
            on_commit()
        if isinstance(written.body, dict):
            return JSONResponse(written.body, status_code=written.status)
        body = written.body
        if wait == "searchable" and flow is not None:
            result = WriteResponse.model_validate_json(body)
            result.searchable = await _until_searchable(flow, result)
            body = result.model_dump_json()
        return Response(body, status_code=written.status, media_type="application/json")

    return router


async def _until_searchable(flow: WriteFlow, result: WriteResponse) -> bool:
    """Wait until the projector applied every accepted item (or the wait ran out)."""
    positions = [item.position for item in result.items if item.position is not None]
    if not positions:
        return True
    target = max(positions)
    deadline = time.monotonic() + flow.limits.searchable_wait_seconds
    changes = flow.changes
    while True:
        # Read before the progress: a change after this read ends the wait below.
        seen = changes.version if changes is not None else 0
        if flow.progress.applied >= target:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if changes is None:
            await asyncio.sleep(WAIT_POLL_SECONDS)
        else:
            # Told when the projector moved (server mode on PostgreSQL), not polled.
            await changes.changed_since(seen, min(flow.poll_seconds, deadline - now))
