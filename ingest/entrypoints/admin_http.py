"""The canonical store's admin routes (admin key, like `/v1/admin/generations`):

| route | what |
|---|---|
| `POST /v1/admin/backups` `{name}` | snapshot store + registry to `<data dir>/backups/<name>` |
| `POST /v1/admin/backups/{name}/verify` | re-read it: the same counts, or `409` |
| `POST /v1/admin/compact` | drop tombstones and superseded revisions, `VACUUM` |

A name that is a path is `422 invalid_request`; an existing name `409 invalid_state`;
with a PostgreSQL store every route is `409 invalid_state` naming PostgreSQL's tools.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from contracts.auth import Access, check_admin_key, declare
from contracts.errors import ErrorCode, OrreryError
from contracts.koutendb_io import (
    BACKUP_NAME_PATTERN,
    BackupRequest,
    BackupResponse,
    CompactResponse,
)
from contracts.openapi import operation
from contracts.wire import loads_strict, validate_strict
from ingest.ports import StoreMaintenance

__all__ = ["create_router"]


def create_router(maintenance: StoreMaintenance, *, admin_key: str) -> APIRouter:
    router = APIRouter(prefix="/v1/admin", tags=["admin"])

    @router.post(
        "/backups",
        openapi_extra={
            **declare(Access.ADMIN),
            **operation(body=BackupRequest, ok=BackupResponse),
        },
    )
    async def post_backup(
        request: Request,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Back up the canonical store and the generation registry under `name`."""
        check_admin_key(admin_key, x_admin_key, authorization)
        raw = await request.body()
        if not raw.strip():
            raise OrreryError(ErrorCode.INVALID_REQUEST, 'send {"name": "..."}')
        body = validate_strict(loads_strict(raw), BackupRequest)
        result = await run_in_threadpool(maintenance.backup, body.name)
        return JSONResponse(result.model_dump(mode="json"))

    @router.post(
        "/backups/{name}/verify",
        openapi_extra={**declare(Access.ADMIN), **operation(ok=BackupResponse)},
    )
    async def post_verify(
        name: Annotated[str, Path(min_length=1, max_length=128, pattern=BACKUP_NAME_PATTERN)],
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Re-read a backup: the same counts as when it was taken, or `409`."""
        check_admin_key(admin_key, x_admin_key, authorization)
        result = await run_in_threadpool(maintenance.verify, name)
        return JSONResponse(result.model_dump(mode="json"))

    @router.post(
        "/compact",
        openapi_extra={**declare(Access.ADMIN), **operation(ok=CompactResponse)},
    )
    async def post_compact(
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Drop tombstones and superseded revisions no reader needs; live data stays."""
        check_admin_key(admin_key, x_admin_key, authorization)
        result = await run_in_threadpool(maintenance.compact)
        return JSONResponse(result.model_dump(mode="json"))

    return router
