"""The query worker's HTTP routes: `create_router(...)`; no I/O at import time."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from contracts.auth import Access, ApiKeyGrant, authenticate, declare
from contracts.chonkydb import (
    RETRIEVE_DIALECT_FIELDS,
    TOPK_DIALECT_FIELDS,
    ChonkyRetrieveRequest,
    ChonkyRetrieveResponse,
    ChonkyTopKRequest,
    ChonkyTopKResponse,
    is_dialect,
)
from contracts.errors import ErrorCode, OrreryError
from contracts.openapi import operation
from contracts.ops import ReadinessResponse, ScopesResponse
from contracts.topk import (
    DocumentIdsResponse,
    RecordsByIdRequest,
    RecordsByIdResponse,
    RetrieveRequest,
    RetrieveResponse,
    StoredRecordOut,
    TopKRequest,
    TopKResponse,
)
from contracts.wire import loads_strict, validate_strict
from query.eligibility import EligibilityGate
from query.entrypoints.chonkydb_http import chonky_retrieve, chonky_topk
from query.ports import NamespaceLog, Routing
from query.scopes import ScopeResolver
from query.service import Principal, QueryLimits, QueryPorts, retrieve, topk_records

__all__ = [
    "KEY_HEADER_PARAMETERS",
    "LEAN_ROUTES",
    "Offload",
    "create_router",
    "parse_body",
    "readiness",
    "readiness_for",
    "ready_check",
]

log = logging.getLogger("orrery.query")
M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")
R = TypeVar("R")

# The API key headers as the OpenAPI document lists them for a route that takes them
# as `Header()` parameters: the hot routes read them from the request instead (no
# per-request dependency solving) and declare them with these, so the document is the
# same.
KEY_HEADER_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": header,
        "in": "header",
        "required": False,
        "schema": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": title},
    }
    for header, title in (("x-api-key", "X-Api-Key"), ("authorization", "Authorization"))
]


# The one-shot routes: their endpoints take only the request (no parameters, no
# dependencies), so the app may call them without the framework's routing
# (`orrery.lean`).
TOPK_PATH = "/v1/external/retrieve/topk_records"
RETRIEVE_PATH = "/v1/external/retrieve"
LEAN_ROUTES: tuple[tuple[str, str], ...] = (("POST", TOPK_PATH), ("POST", RETRIEVE_PATH))


class Offload:
    """Runs a blocking use case on a worker thread and awaits it: the one-shot routes'
    hop off the event loop. The same threads and context propagation as
    `run_in_threadpool` (40 threads at most, `contextvars` copied), at about half its
    cost per call (no capacity limiter or cancel scope). A request whose client goes
    away stops waiting; its call finishes on its thread, as with `run_in_threadpool`."""

    def __init__(self, max_threads: int = 40) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="orrery-query")

    async def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """Stop taking calls (running ones finish)."""
        self._pool.shutdown(wait=False)


class Inline(Offload):
    """Runs the use case on the event loop's own thread: the one-shot routes of the
    embedded stack, whose engines are in this process. There the query is CPU work under
    the GIL from end to end (tantivy's search lets the GIL go on the source pool's thread
    either way), so a hop to a worker thread buys no concurrency and costs ~0.4 ms a
    query (a futures round trip and two GIL hand-overs; docs/bench/README.md). A server
    deployment offloads: its queries wait on the network."""

    def __init__(self) -> None:
        pass

    async def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        return fn(*args, **kwargs)

    def close(self) -> None:
        pass


def _json(model: BaseModel) -> Response:
    """A model as a JSON response, serialized once by pydantic (no intermediate dicts
    re-encoded by `json`: the largest answers carry every payload), as bytes: the bytes
    of `model_dump_json()` without its decode and the response's encode again."""
    return Response(model.__pydantic_serializer__.to_json(model), media_type="application/json")


async def parse_body(request: Request, model: type[M]) -> M:
    """Parse a JSON body strictly (`contracts.wire.loads_strict`): bad JSON, unknown fields
    and wrong types are 4xx."""
    return validate_strict(loads_strict(await request.body()), model)


def create_router(
    *,
    ports: QueryPorts,
    limits: QueryLimits,
    grants: dict[str, ApiKeyGrant],
    document_ids: Callable[[str, str | None], list[str]] | None = None,
    status: Callable[[], dict[str, Any]] | None = None,
    eligibility: EligibilityGate | None = None,
    inline: bool = False,
) -> APIRouter:
    """The query worker's routes. `status` adds process-level facts (e.g. projector
    state) to readiness; `eligibility` adds each live generation's eligibility verdict
    to it; `inline`: the one-shot routes rank on the event loop's thread (`Inline`: the
    embedded stack), not on a worker thread. The app around them (errors, limits,
    OpenAPI) is `orrery.http.build_app`."""
    router = APIRouter()
    offload = Inline() if inline else Offload()

    def principal(x_api_key: str | None, authorization: str | None) -> Principal:
        grant = authenticate(grants, x_api_key, authorization)
        return Principal() if grant is None else Principal(grant.namespace, grant.galaxy)

    def caller(request: Request) -> Principal:
        headers = request.headers
        return principal(headers.get("x-api-key"), headers.get("authorization"))

    @router.post(
        TOPK_PATH,
        tags=["query"],
        openapi_extra={
            **declare(Access.READ),
            **operation(
                body=(TopKRequest, ChonkyTopKRequest), ok=(TopKResponse, ChonkyTopKResponse)
            ),
            "parameters": KEY_HEADER_PARAMETERS,
        },
    )
    async def post_topk_records(request: Request) -> Response:
        """Orrery's one-shot top-k; a body with a ChonkyDB-only field
        (`contracts.chonkydb.TOPK_DIALECT_FIELDS`) is ChonkyDB's request and gets
        ChonkyDB's answer (docs/chonkydb.md)."""
        who = caller(request)
        raw = loads_strict(await request.body())
        if is_dialect(raw, TOPK_DIALECT_FIELDS) or not _own_shape(raw):
            dialect = validate_strict(raw, ChonkyTopKRequest)
            chonky = await offload(chonky_topk, dialect, principal=who, ports=ports, limits=limits)
            return _json(chonky)
        body = validate_strict(raw, TopKRequest)
        response = await offload(topk_records, body, principal=who, ports=ports, limits=limits)
        return _json(response)

    @router.post(
        RETRIEVE_PATH,
        tags=["query"],
        openapi_extra={
            **declare(Access.READ),
            **operation(
                body=(RetrieveRequest, ChonkyRetrieveRequest),
                ok=(RetrieveResponse, ChonkyRetrieveResponse, ChonkyTopKResponse),
            ),
            "parameters": KEY_HEADER_PARAMETERS,
        },
    )
    async def post_retrieve(request: Request) -> Response:
        """Orrery's generic retrieve; a body with a ChonkyDB-only field
        (`contracts.chonkydb.RETRIEVE_DIALECT_FIELDS`) is ChonkyDB's (docs/chonkydb.md)."""
        who = caller(request)
        raw = loads_strict(await request.body())
        if is_dialect(raw, RETRIEVE_DIALECT_FIELDS) or not _own_shape(raw):
            dialect = validate_strict(raw, ChonkyRetrieveRequest)
            chonky = await offload(
                chonky_retrieve, dialect, principal=who, ports=ports, limits=limits
            )
            return _json(chonky)
        body = validate_strict(raw, RetrieveRequest)
        response = await offload(retrieve, body, principal=who, ports=ports, limits=limits)
        return _json(response)

    @router.get(
        "/v1/scopes/document_ids",
        tags=["query"],
        openapi_extra={**declare(Access.READ), **operation(ok=DocumentIdsResponse)},
    )
    async def get_scope_document_ids(
        namespace: str,
        scope_ref: str,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """The document ids the scope's live (or pinned: `…@g42`) generation holds (the
        split path's step 1); a galaxy-bound key sees its galaxy's only."""
        who = principal(x_api_key, authorization)
        _check_namespace(who, namespace)
        resolver = ports.scopes or ScopeResolver(ports.routing)
        route = await run_in_threadpool(
            resolver.route, namespace, resolver.target(namespace, scope_ref)
        )
        if document_ids is None:
            raise OrreryError(ErrorCode.SCOPE_NOT_READY, f"scope {scope_ref!r} is not ready")
        ids = await run_in_threadpool(document_ids, route.generation_id, who.galaxy)
        out = DocumentIdsResponse(
            scope_ref=scope_ref, generation_id=route.generation_id, document_ids=ids
        )
        return JSONResponse(out.model_dump(mode="json"))

    @router.get(
        "/v1/scopes",
        tags=["query"],
        openapi_extra={**declare(Access.READ), **operation(ok=ScopesResponse)},
    )
    async def get_scopes(
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Every scope ref a query may name, per namespace with a live generation (the
        key's namespace only): built-in, configured (`ORRERY_SCOPES`) and runtime refs
        (`longterm:<kind>:current` of a snapshot kind no ref names, registered when its
        first generation went live)."""
        who = principal(x_api_key, authorization)
        resolver = ports.scopes or ScopeResolver(ports.routing)
        only = None if who.namespace is None else [who.namespace]
        namespaces = await run_in_threadpool(resolver.listing, only)
        out = ScopesResponse.model_validate({"namespaces": namespaces})
        return JSONResponse(out.model_dump(mode="json"))

    @router.post(
        "/v1/records/by_id",
        tags=["query"],
        openapi_extra={
            **declare(Access.READ),
            **operation(body=RecordsByIdRequest, ok=RecordsByIdResponse),
        },
    )
    async def post_records_by_id(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Current payloads of documents by id (the split path's hydration step)."""
        who = principal(x_api_key, authorization)
        body = await parse_body(request, RecordsByIdRequest)
        _check_namespace(who, body.namespace)
        rows = await run_in_threadpool(ports.records.heads, body.namespace, body.document_ids)
        # A document of another galaxy answers exactly like an unknown id: missing.
        rows = [r for r in rows if who.galaxy is None or r.galaxy == who.galaxy]
        order = {doc_id: i for i, doc_id in enumerate(body.document_ids)}
        rows.sort(key=lambda r: order[r.document_id])
        found = {r.document_id for r in rows}
        records = []
        for row in rows:
            record = json.loads(row.record_json)
            records.append(
                StoredRecordOut(
                    document_id=row.document_id,
                    item_id=row.item_id,
                    revision=row.revision,
                    payload_schema=record.get("payload_schema", ""),
                    payload=record["payload"],
                    metadata={**record["metadata"], "payload_sha256": row.payload_sha256},
                )
            )
        out = RecordsByIdResponse(
            records=records, missing=[d for d in body.document_ids if d not in found]
        )
        return JSONResponse(out.model_dump(mode="json"))

    @router.get(
        "/v1/readiness",
        tags=["ops"],
        openapi_extra={
            **declare(Access.OPS),
            **operation(ok=ReadinessResponse, also={503: ReadinessResponse}),
        },
    )
    async def get_readiness(
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> JSONResponse:
        """Per scope readiness: HTTP 200 when `ready`, 503 with the same body while not
        (so a load balancer or `curl -f` needs no JSON). With API keys configured it
        needs one and shows only the key's namespace (a galaxy-bound key: without
        namespace-wide document counts)."""
        grant = authenticate(grants, x_api_key, authorization)

        def answer() -> dict[str, Any]:
            body = readiness(ports.routing, status, eligibility)
            return (
                body if grant is None else readiness_for(body, grant, ports.routing.namespace_log)
            )

        out = await run_in_threadpool(answer)
        return JSONResponse(out, status_code=200 if out["ready"] else 503)

    return router


def _own_shape(raw: object) -> bool:
    """Whether a body can be Orrery's own request (it names `namespace` and `scope_ref`,
    which Orrery's shape requires): any other body is read as ChonkyDB's, so every body
    valid for either schema of the path's `anyOf` is answered as valid."""
    return isinstance(raw, dict) and "namespace" in raw and "scope_ref" in raw


def _check_namespace(who: Principal, namespace: str) -> None:
    if who.namespace is not None and who.namespace != namespace:
        raise OrreryError(ErrorCode.FORBIDDEN, f"this API key may not read namespace {namespace!r}")


# What a tenant's key may see of readiness: its own scopes and its own log positions.
_TENANT_READINESS = ("success", "coverage_fallback", "mode")
# Far past any position: a namespace's newest position without counting its events.
_END = 2**62


def readiness_for(
    body: dict[str, Any],
    grant: ApiKeyGrant,
    namespace_log: Callable[[str, int], NamespaceLog] | None = None,
) -> dict[str, Any]:
    """The readiness `body` as one key may see it: only its namespace's scopes (without
    document counts when the key is bound to one galaxy), no process-level facts, and
    only its own log positions (`namespace_log`, issue 22): `log_high_water` is the
    namespace's newest position, a scope's `applied_position` is never shown past it,
    and `lag_events` / `lag_seconds` count the namespace's own events only — the global
    write counter and other tenants' backlogs stay hidden."""
    namespace = grant.namespace
    own = None if namespace_log is None else namespace_log(namespace, _END)
    scopes = []
    for scope in body["scopes"]:
        if scope["namespace"] != namespace:
            continue
        if grant.galaxy is not None:
            scope = {k: v for k, v in scope.items() if k != "document_count"}
        if namespace_log is not None and own is not None:
            applied = min(int(scope["applied_position"]), own.high_water)
            log = namespace_log(namespace, applied)
            oldest = log.oldest_pending_at
            scope = {
                **scope,
                "applied_position": applied,
                "log_high_water": own.high_water,
                "lag_events": log.pending,
                "lag_seconds": 0.0
                if oldest is None
                else round(max(0.0, (datetime.now(UTC) - oldest).total_seconds()), 3),
            }
        scopes.append(scope)
    out = {k: body[k] for k in _TENANT_READINESS if k in body}
    out["log_high_water"] = body["log_high_water"] if own is None else own.high_water
    measured = body.get("projector_log")
    keyed = measured
    if measured is not None:
        if namespace_log is None or own is None:
            keyed = {"current": measured["current"], "lag_events": measured["lag_events"]}
        else:
            # The namespace's own view (never its consumer, position or the global lag):
            # its events after the newest of the projector's applied position for it
            # (stored with each batch) and the position a measured lag of 0 vouches for,
            # and on Kafka those before it still unapplied on another partition (counted
            # by partition and offset: `Routing.namespace_log`).
            position = int(measured["position"])
            vouched = position if measured["lag_events"] == 0 else 0
            after = max(own.applied, vouched)
            keyed = {
                "current": bool(measured["current"]) or after >= own.high_water,
                "lag_events": namespace_log(namespace, after).pending,
                "dead_letters": own.dead_letters,
            }
        out["projector_log"] = keyed
    out["scopes"] = scopes
    # Ready on the namespace's own measurement: another tenant's backlog or dead letters
    # never make this one unready. On Kafka the applied position is the newest of the
    # namespace's events applied over its topic's partitions, so an event still held by
    # another partition is counted by its offset, never assumed applied.
    out["ready"] = _is_ready(scopes, keyed) and not _failing(body)
    return out


def _is_ready(scopes: list[dict[str, Any]], projector_log: dict[str, Any] | None) -> bool:
    """Every scope caught up and eligible, and the projector's own log lag (when it
    measures one) taken at the high water or later and 0."""
    log_ok = projector_log is None or (
        bool(projector_log["current"]) and projector_log["lag_events"] == 0
    )
    return log_ok and all(s["lag_events"] == 0 and s.get("eligible", True) for s in scopes)


def ready_check(
    routing: Routing,
    status: Callable[[], dict[str, Any]] | None,
    eligibility: EligibilityGate | None = None,
) -> Callable[[ApiKeyGrant | None], bool]:
    """Whether `/v1/readiness` answers ready for a key (None: no keys configured)."""

    def ready(grant: ApiKeyGrant | None) -> bool:
        body = readiness(routing, status, eligibility)
        if grant is not None:
            body = readiness_for(body, grant, routing.namespace_log)
        return bool(body["ready"])

    return ready


def readiness(
    routing: Routing,
    status: Callable[[], dict[str, Any]] | None,
    eligibility: EligibilityGate | None = None,
) -> dict[str, Any]:
    """Per scope: the live generation, its descriptor digest and eligibility, the log
    high-water, the applied position and the lag in events and in seconds (the age of the
    oldest event not applied yet). Ready when every scope has no lag and is eligible (the
    named generation's verdict, not stale: a ready scope is queryable) and the
    projector's own lag measurement (`projector_log`: Kafka consumer-group lag over all
    partitions, or the outbox rows after its position) is 0 and taken at the high water
    or later. A partitioned log applies out of position order, so the applied
    position alone may claim "caught up" while another partition still holds events.
    Never ready while this process's projector or relay loop is failing."""
    high_water = routing.log_high_water()
    log_status = routing.log_status()
    log_current = log_status is not None and log_status.position >= high_water
    now = datetime.now(UTC)
    scopes = []
    for scope in routing.scopes():
        entry = scope.model_dump(mode="json")
        entry["log_high_water"] = high_water
        entry["lag_events"] = max(0, high_water - scope.applied_position)
        oldest = routing.oldest_unapplied_at(scope.applied_position)
        entry["lag_seconds"] = (
            0.0 if oldest is None else round(max(0.0, (now - oldest).total_seconds()), 3)
        )
        if eligibility is not None:
            # The verdict of exactly the generation named, for its registry facts now:
            # a negative one taken before they moved is stale (and re-taken meanwhile).
            verdict = eligibility.status(
                scope.generation_id, state=scope.state, commit_seq=scope.commit_seq
            )
            entry["eligible"] = (
                verdict["eligible"] is True
                and not verdict.get("stale", False)
                and scope.state == "live"
            )
            entry["eligibility"] = verdict
        scopes.append(entry)
    projector_log = (
        None
        if log_status is None
        else {**log_status.model_dump(mode="json"), "current": log_current}
    )
    body: dict[str, Any] = {
        "success": True,
        "log_high_water": high_water,
        "scopes": scopes,
        "ready": _is_ready(scopes, projector_log),
    }
    if projector_log is not None:
        body["projector_log"] = projector_log
    if eligibility is not None:
        body["coverage_fallback"] = eligibility.fallback
    if status is not None:
        body.update(status())
        # A background loop of this process failing right now (its dependency down): its
        # scopes may look caught up, but nothing new reaches them.
        body["ready"] = body["ready"] and not _failing(body)
    return body


def _failing(body: dict[str, Any]) -> bool:
    """Whether the projector or relay loop of this process failed its last step."""
    return any(
        isinstance(body.get(loop), dict) and body[loop].get("last_error")
        for loop in ("projector", "relay")
    )
