"""KoutenDB's data routes over the canonical store: `POST /v1/koutendb/import` (JSONL in)
and `GET /v1/koutendb/dump` (`koutendb.dump.v1` out).

Both live on the write side (ingest) because the canonical store is ingest's: an import
is a sequence of record batches written like `POST /v1/records` writes them, and a dump
reads the live head revisions of the store (not an index generation), so it holds
exactly what was acknowledged, projected or not. The envelope routes of `/v1/koutendb`
(retrieve, plan, atlas, …) are the query side's.

Galaxy rule: a request reads or writes exactly one galaxy, the API key's, else the
request's `galaxy`, else `default`; a key bound to a galaxy naming another is `403`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from contracts.auth import Access, ApiKeyGrant, authenticate, check_reach, declare
from contracts.auth import resolve_galaxy as _resolve_galaxy
from contracts.errors import ErrorCode, OrreryError
from contracts.koutendb import AnyJson
from contracts.koutendb_io import (
    MAX_IMPORT_BATCH,
    DumpDocumentLine,
    DumpMetaLine,
    DumpRingLine,
    ImportResponse,
)
from contracts.openapi import operation
from contracts.params import query_bool, query_int
from ingest.koutendb_io import (
    MAX_IMPORT_BATCH_BYTES,
    ImportOptions,
    JsonlImporter,
    LineSplitter,
    dump_lines,
)
from ingest.pacing import WritePacer
from ingest.ports import RecordStore

__all__ = [
    "DEFAULT_SCOPE_REF",
    "DUMP_PATH",
    "IMPORT_PATH",
    "NDJSON",
    "create_router",
    "resolve_galaxy",
]

IMPORT_PATH = "/v1/koutendb/import"
DUMP_PATH = "/v1/koutendb/dump"
NDJSON = "application/x-ndjson"
# KoutenDB clients know no scope refs: without one, import and dump use Orrery's default.
DEFAULT_SCOPE_REF = "longterm:objects:current"

_IMPORT_PARAMS = frozenset(
    {
        "namespace",
        "scopeRef",
        "galaxy",
        "defaultRing",
        "ringField",
        "ringPrefix",
        "payloadField",
        "vecField",
        "idField",
        "batchSize",
    }
)
_DUMP_PARAMS = frozenset({"namespace", "scopeRef", "galaxy", "includeVectors"})


def _import_openapi() -> dict[str, Any]:
    """One JSON value per line (`contracts.koutendb.AnyJson`: a line that is no record
    is counted in `errors`, `ImportLine` says which are): `application/x-ndjson` (or
    JSON lines' other names), and `application/json` for a body of one line. An empty
    body imports nothing."""
    fragment = operation(body=AnyJson, ok=ImportResponse, body_required=False)
    content = fragment["requestBody"]["content"]
    content[NDJSON] = content["application/json"]
    return fragment


def _dump_openapi() -> dict[str, Any]:
    """The 200 is JSON lines, each one of the three line shapes."""
    fragment = operation(ok=(DumpMetaLine, DumpRingLine, DumpDocumentLine))
    ok = fragment["responses"]["200"]["content"]
    ok[NDJSON] = ok.pop("application/json")
    return fragment


def resolve_galaxy(grant: ApiKeyGrant | None, requested: str | None) -> str:
    """The one galaxy a request reaches (`contracts.auth.resolve_galaxy`, the rule of
    every route): the key's, else the request's, else `default`."""
    return _resolve_galaxy(None if grant is None else grant.galaxy, requested)


def _params(request: Request, allowed: frozenset[str]) -> dict[str, str]:
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise OrreryError(
            ErrorCode.UNKNOWN_FIELD,
            f"unknown query parameters: {', '.join(unknown)}",
            {"unknown": unknown, "allowed": sorted(allowed)},
        )
    repeated = sorted(k for k in allowed if len(request.query_params.getlist(k)) > 1)
    if repeated:
        raise OrreryError(ErrorCode.INVALID_REQUEST, f"given more than once: {repeated}")
    return dict(request.query_params)


def _namespace(grant: ApiKeyGrant | None, params: dict[str, str]) -> str:
    namespace = params.get("namespace") or (None if grant is None else grant.namespace)
    if not namespace:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "namespace is required")
    return namespace


def _int(params: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = query_int(text)
    except ValueError:
        value = None
    if not isinstance(value, int) or not low <= value <= high:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST, f"{name} must be an integer from {low} to {high}"
        )
    return value


def _bool(params: dict[str, str], name: str, default: bool) -> bool:
    text = params.get(name)
    if text is None:
        return default
    try:
        return bool(query_bool(text))
    except ValueError:
        raise OrreryError(ErrorCode.INVALID_REQUEST, f"{name} must be true or false") from None


def _ring_text(params: dict[str, str], name: str, default: str) -> str:
    value = params.get(name, default)
    if len(value) > 512:
        raise OrreryError(ErrorCode.INVALID_REQUEST, f"{name} is longer than 512 characters")
    return value


def create_router(
    *,
    store: RecordStore,
    grants: dict[str, ApiKeyGrant],
    max_batch: int,
    vector_dimension: int | None,
    max_record_bytes: int,
    on_commit: Callable[[], None] | None = None,
    resolve_scope: Callable[[str, str], str],
    max_batch_bytes: int = MAX_IMPORT_BATCH_BYTES,
    pacer: WritePacer | None = None,
) -> APIRouter:
    """The import and dump routes over `store`. `resolve_scope(namespace, scope_ref)` is
    the snapshot kind a scope ref names (`404 unknown_scope` otherwise). Each import
    batch is paced by `pacer` like `POST /v1/records` (`ingest.pacing`)."""
    router = APIRouter(tags=["koutendb"])
    pacer = pacer or WritePacer(None)

    def target(
        request: Request,
        known: frozenset[str],
        x_api_key: str | None,
        authorization: str | None,
    ) -> tuple[dict[str, str], str, str, str]:
        """The request's parameters and the namespace, galaxy and snapshot kind it may
        reach (401/403/404 otherwise)."""
        grant = authenticate(grants, x_api_key, authorization)
        params = _params(request, known)
        namespace = _namespace(grant, params)
        galaxy = resolve_galaxy(grant, params.get("galaxy"))
        check_reach(grant, namespace, galaxy)
        kind = resolve_scope(namespace, params.get("scopeRef") or DEFAULT_SCOPE_REF)
        return params, namespace, galaxy, kind

    @router.post(
        IMPORT_PATH,
        openapi_extra={**declare(Access.WRITE), **_import_openapi()},
    )
    async def post_import(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Import JSON lines (KoutenDB dump lines or any NoSQL export) into one galaxy of
        one scope, `batchSize` records per store transaction. A line that cannot become a
        record is counted in `errors` with its line number; the import goes on."""
        params, namespace, galaxy, kind = target(request, _IMPORT_PARAMS, x_api_key, authorization)
        options = ImportOptions(
            namespace=namespace,
            snapshot_kind=kind,
            galaxy=galaxy,
            default_ring=_ring_text(params, "defaultRing", "imported"),
            ring_field=params.get("ringField") or None,
            ring_prefix=_ring_text(params, "ringPrefix", ""),
            payload_field=params.get("payloadField") or None,
            vec_field=params.get("vecField") or None,
            id_field=params.get("idField") or None,
            batch_size=_int(params, "batchSize", 1_000, 1, min(max_batch, MAX_IMPORT_BATCH)),
            vector_dimension=vector_dimension,
            max_batch_bytes=max_batch_bytes,
            max_record_bytes=max_record_bytes,
        )
        importer = JsonlImporter(options, store, on_commit)
        splitter = LineSplitter()

        async def write_batch() -> None:
            # Paced like POST /v1/records: the namespace's writers one at a time, each
            # batch only while the namespace is within its backlog bound.
            async with pacer.admitted([namespace]):
                await run_in_threadpool(importer.write_pending)

        try:
            async for chunk in request.stream():
                for line in splitter.feed(chunk):
                    if importer.add(line):
                        await write_batch()
            for line in splitter.close():
                importer.add(line)
            await write_batch()
        except OrreryError as exc:
            # A store fault, the backlog or the body limit stops the import: say how far
            # it got, the batches before it are written.
            progress = importer.result().model_dump(mode="json", exclude={"errorLines"})
            stopped = OrreryError(
                exc.code,
                f"{exc.message} (the import stopped after {importer.imported} records; "
                "re-running it updates them)",
                {**exc.details, "progress": progress},
            )
            stopped.headers = getattr(exc, "headers", None)  # type: ignore[attr-defined]
            raise stopped from exc
        return JSONResponse(importer.result().model_dump(mode="json"))

    @router.get(
        DUMP_PATH,
        response_class=StreamingResponse,
        openapi_extra={**declare(Access.READ), **_dump_openapi()},
    )
    async def get_dump(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> StreamingResponse:
        """The live records of one galaxy of one scope as `koutendb.dump.v1` JSON lines:
        a `meta` line, a `ring` line per ring (implied parents too), a `document` line per
        record (`vec` when `includeVectors` and the record carries its own vector)."""
        params, namespace, galaxy, kind = target(request, _DUMP_PARAMS, x_api_key, authorization)
        lines = dump_lines(
            store=store,
            namespace=namespace,
            snapshot_kind=kind,
            galaxy=galaxy,
            include_vectors=_bool(params, "includeVectors", True),
        )
        # The snapshot is read before the status line goes out: a store fault is an
        # explicit error response, never a 200 with a cut-off body.
        first = await run_in_threadpool(next, lines)

        def body() -> Iterator[bytes]:
            yield first
            yield from lines

        return StreamingResponse(body(), media_type=NDJSON)

    return router
