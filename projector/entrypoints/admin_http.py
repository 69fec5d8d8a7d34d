"""The admin HTTP API over generations: `/v1/admin/generations…`.

Every route needs the admin key (`ORRERY_ADMIN_KEY`) as `x-admin-key` or
`Authorization: Bearer`: no key → 401 `unauthorized`, a wrong key → 403 `forbidden`, no
admin key configured on the server → 403 (the API is off). Errors use the app's error
handlers (`{"success": false, "error": {...}}`).

| route | what |
|---|---|
| `GET  /v1/admin/generations[?namespace=&snapshot_kind=]` | registry rows |
| `POST /v1/admin/generations/build` `{namespace, snapshot_kind}` | start a build (202) |
| `GET  /v1/admin/generations/{id}` | row, descriptor, recent checks, build progress |
| `POST /v1/admin/generations/{id}/verify` | read back and compare; `verified` true/false |
| `POST /v1/admin/generations/{id}/qualify` `{queries?, sample_size?}` | run and store a receipt |
| `GET  /v1/admin/generations/{id}/receipts` | its qualification receipts, newest first |
| `POST /v1/admin/generations/{id}/promote` | flip the live pointer, mirror aliases (1) |
| `POST /v1/admin/generations/rollback` `{namespace, snapshot_kind}` | back to the previous |
| `POST /v1/admin/generations/{id}/retire` | stop writing it; `gc` drops it later |
| `POST /v1/admin/generations/{id}/abort` | stop a build (the generation fails) |
| `POST /v1/admin/generations/gc` `{keep}` | drop indexes of retired/failed ones |

(1) A sharded or replicated generation needs a passing receipt for its current
descriptor digest: else 409 `qualification_required` / `qualification_failed`.
"""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from contracts.admin import (
    BuildRequest,
    DescriptorResponse,
    GcRequest,
    GcResponse,
    GenerationListResponse,
    GenerationViewResponse,
    PromoteResponse,
    QualifyResponse,
    ReceiptListResponse,
    RollbackRequest,
    VerifyResponse,
)
from contracts.auth import Access, check_admin_key, declare
from contracts.errors import ErrorCode, OrreryError
from contracts.openapi import operation
from contracts.qualification import QualifyRequest
from contracts.wire import loads_strict
from projector.generations import GenerationAdmin

__all__ = ["ADMIN_PREFIX", "check_admin_key", "create_admin_router"]

ADMIN_PREFIX = "/v1/admin/generations"
M = TypeVar("M", bound=BaseModel)


async def _body(request: Request, model: type[M]) -> M:
    raw_bytes = await request.body()
    raw = loads_strict(raw_bytes) if raw_bytes.strip() else {}
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        details = {
            "errors": [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
        }
        code = (
            ErrorCode.UNKNOWN_FIELD
            if any(e["type"] == "extra_forbidden" for e in errors)
            else ErrorCode.INVALID_REQUEST
        )
        raise OrreryError(code, "the request is invalid", details) from exc


def _ok(body: BaseModel, status: int = 200) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"), status_code=status)


def create_admin_router(admin: GenerationAdmin, *, admin_key: str) -> APIRouter:
    """The admin routes over `admin`; blocking work runs in the thread pool."""
    router = APIRouter(prefix=ADMIN_PREFIX, tags=["admin"])

    def authorize(x_admin_key: str | None, authorization: str | None) -> None:
        check_admin_key(admin_key, x_admin_key, authorization)

    @router.get("", openapi_extra={**declare(Access.ADMIN), **operation(ok=GenerationListResponse)})
    async def list_generations(
        namespace: str | None = None,
        snapshot_kind: str | None = None,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        authorize(x_admin_key, authorization)
        rows = await run_in_threadpool(admin.rows, namespace, snapshot_kind)
        return _ok(GenerationListResponse(generations=rows))

    @router.post(
        "/build",
        status_code=202,
        openapi_extra={
            **declare(Access.ADMIN),
            **operation(body=BuildRequest, ok=GenerationViewResponse, status=202),
        },
    )
    async def build(
        request: Request,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Start a build in this process; poll `GET …/{id}` for its progress."""
        authorize(x_admin_key, authorization)
        body = await _body(request, BuildRequest)
        descriptor = await run_in_threadpool(admin.start_build, body)
        view = await run_in_threadpool(admin.view, descriptor.generation_id)
        return _ok(GenerationViewResponse(**dict(view)), status=202)

    @router.post(
        "/rollback",
        openapi_extra={
            **declare(Access.ADMIN),
            **operation(body=RollbackRequest, ok=PromoteResponse),
        },
    )
    async def rollback(
        request: Request,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        authorize(x_admin_key, authorization)
        body = await _body(request, RollbackRequest)
        report = await run_in_threadpool(admin.rollback, body)
        return _ok(PromoteResponse(report=report))

    @router.post(
        "/gc",
        openapi_extra={
            **declare(Access.ADMIN),
            **operation(body=GcRequest, body_required=False, ok=GcResponse),
        },
    )
    async def gc(
        request: Request,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        authorize(x_admin_key, authorization)
        body = await _body(request, GcRequest)
        report = await run_in_threadpool(admin.gc, body.keep)
        return _ok(GcResponse(report=report))

    @router.get(
        "/{generation_id}",
        openapi_extra={**declare(Access.ADMIN), **operation(ok=GenerationViewResponse)},
    )
    async def show(
        generation_id: str,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        authorize(x_admin_key, authorization)
        view = await run_in_threadpool(admin.view, generation_id)
        return _ok(GenerationViewResponse(**dict(view)))

    @router.post(
        "/{generation_id}/verify",
        openapi_extra={**declare(Access.ADMIN), **operation(ok=VerifyResponse)},
    )
    async def verify(
        generation_id: str,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """200 either way: `verified` says whether the evidence matched."""
        authorize(x_admin_key, authorization)
        check = await run_in_threadpool(admin.verify, generation_id)
        row = (await run_in_threadpool(admin.view, generation_id)).row
        return _ok(VerifyResponse(verified=check.ok, state=row.state, check=check))

    @router.post(
        "/{generation_id}/promote",
        openapi_extra={**declare(Access.ADMIN), **operation(ok=PromoteResponse)},
    )
    async def promote(
        generation_id: str,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        authorize(x_admin_key, authorization)
        report = await run_in_threadpool(admin.promote, generation_id)
        return _ok(PromoteResponse(report=report))

    @router.post(
        "/{generation_id}/qualify",
        openapi_extra={
            **declare(Access.ADMIN),
            **operation(body=QualifyRequest, body_required=False, ok=QualifyResponse),
        },
    )
    async def qualify(
        generation_id: str,
        request: Request,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """200 with the stored receipt, passing or not (`receipt.passed`)."""
        authorize(x_admin_key, authorization)
        body = await _body(request, QualifyRequest)
        receipt = await run_in_threadpool(admin.qualify, generation_id, body)
        return _ok(QualifyResponse(receipt=receipt))

    @router.get(
        "/{generation_id}/receipts",
        openapi_extra={**declare(Access.ADMIN), **operation(ok=ReceiptListResponse)},
    )
    async def receipts(
        generation_id: str,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        authorize(x_admin_key, authorization)
        found = await run_in_threadpool(admin.receipts, generation_id)
        return _ok(ReceiptListResponse(generation_id=generation_id, receipts=found))

    @router.post(
        "/{generation_id}/retire",
        openapi_extra={**declare(Access.ADMIN), **operation(ok=DescriptorResponse)},
    )
    async def retire(
        generation_id: str,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        authorize(x_admin_key, authorization)
        descriptor = await run_in_threadpool(admin.retire, generation_id)
        return _ok(DescriptorResponse(descriptor=descriptor))

    @router.post(
        "/{generation_id}/abort",
        openapi_extra={**declare(Access.ADMIN), **operation(ok=DescriptorResponse)},
    )
    async def abort(
        generation_id: str,
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        authorize(x_admin_key, authorization)
        descriptor = await run_in_threadpool(admin.abort, generation_id)
        return _ok(DescriptorResponse(descriptor=descriptor))

    return router
