"""HTTP routes of ingest: `POST /v1/records`."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from contracts.auth import Access, ApiKeyGrant, authenticate, declare
from contracts.errors import ErrorCode
from contracts.ingest_api import WriteRequest, WriteResponse
from contracts.openapi import operation
from contracts.records import Record
from contracts.wire import loads_strict
from ingest.ports import RecordStore
from ingest.service import parse_batch, write_records

__all__ = ["create_router"]


def create_router(
    *,
    store: RecordStore,
    grants: dict[str, ApiKeyGrant],
    max_batch: int,
    vector_dimension: int | None,
    on_commit: Callable[[], None] | None = None,
) -> APIRouter:
    router = APIRouter()

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
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """Write a batch of records (upserts and tombstones) in one transaction.

        200 with per-record statuses (201 accepted, 409 stale revision); 409 when no
        record was accepted; 4xx with nothing written when any record is invalid.
        """
        grant = authenticate(grants, x_api_key, authorization)
        raw = await request.body()

        def parse() -> list[Record]:
            return parse_batch(
                loads_strict(raw),
                max_batch=max_batch,
                vector_dimension=vector_dimension,
                allowed_namespace=None if grant is None else grant.namespace,
                allowed_galaxy=None if grant is None else grant.galaxy,
            )

        # Parsing a batch of vectors takes tens of ms: off the event loop, which keeps
        # answering queries meanwhile.
        records = await run_in_threadpool(parse)
        result = await run_in_threadpool(write_records, records, store=store, on_commit=on_commit)
        if result.accepted == 0:
            body = {
                "success": False,
                "error": {
                    "code": ErrorCode.REVISION_CONFLICT.value,
                    "message": "no record was accepted: every revision is stale",
                    "details": result.model_dump(mode="json"),
                },
            }
            return JSONResponse(body, status_code=409)
        # Serialized by pydantic in one call: a batch's response holds an item per record.
        return Response(result.model_dump_json(), status_code=200, media_type="application/json")

    return router
