"""HTTP routes of ingest: `POST /v1/records`."""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from contracts.auth import ApiKeyGrant, authenticate
from contracts.errors import ErrorCode, OrreryError
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

    @router.post("/v1/records", tags=["ingest"])
    async def post_records(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Write a batch of records (upserts and tombstones) in one transaction.

        200 with per-record statuses (201 accepted, 409 stale revision); 409 when no
        record was accepted; 4xx with nothing written when any record is invalid.
        """
        grant = authenticate(grants, x_api_key, authorization)
        try:
            raw = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise OrreryError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {exc}") from exc
        records = parse_batch(
            raw,
            max_batch=max_batch,
            vector_dimension=vector_dimension,
            allowed_namespace=None if grant is None else grant.namespace,
        )
        if grant is not None and grant.galaxy is not None:
            for index, record in enumerate(records):
                if record.galaxy != grant.galaxy:
                    raise OrreryError(
                        ErrorCode.FORBIDDEN,
                        f"this API key may only write galaxy {grant.galaxy!r}",
                        {"index": index, "galaxy": record.galaxy},
                    )
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
        return JSONResponse(result.model_dump(mode="json"), status_code=200)

    return router
