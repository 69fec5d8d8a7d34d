"""KoutenDB's retrieval envelope routes under `/v1/koutendb` (docs/koutendb.md).

Retrieval, plans, the validator, search profiles, the atlas and the utility loop; the
import/dump routes of the same prefix are ingest's. Every route takes Orrery's API
keys and answers Orrery's error shape; bodies are parsed strictly (unknown fields
`422 unknown_field`).
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel

from contracts.auth import Access, ApiKeyGrant, authenticate, declare
from contracts.errors import ErrorCode, OrreryError
from contracts.koutendb import (
    AnyJson,
    Atlas,
    Envelope,
    FeedbackRequest,
    FeedbackResponse,
    KoutenPlanRequest,
    KoutenRetrieveRequest,
    PlanResponse,
    ProfileBody,
    ProfileResponse,
    ProfilesResponse,
    RecommendationsResponse,
    ValidateResponse,
    retrieval_envelope_validation_errors,
)
from contracts.names import Namespace
from contracts.openapi import operation
from contracts.params import AS_INT
from contracts.records import Name
from contracts.wire import loads_strict, validate_strict
from query.koutendb import (
    KoutenPorts,
    atlas,
    delete_profile,
    list_profiles,
    plan_request,
    post_feedback,
    put_profile,
    recommendations,
    retrieve_envelope,
)
from query.service import Principal

__all__ = ["create_router"]

PREFIX = "/v1/koutendb"
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(by_alias=True), media_type="application/json")


def _profile_name(name: str) -> str:
    if not _PROFILE_NAME.fullmatch(name):
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "a profile name is 1-64 letters, digits, '_', '.', '-', starting with a letter "
            "or digit",
        )
    return name


def create_router(*, ports: KoutenPorts, grants: dict[str, ApiKeyGrant]) -> APIRouter:
    """The `/v1/koutendb` read routes over the query service."""
    router = APIRouter()

    def principal(x_api_key: str | None, authorization: str | None) -> Principal:
        grant = authenticate(grants, x_api_key, authorization)
        return Principal() if grant is None else Principal(grant.namespace, grant.galaxy)

    @router.post(
        f"{PREFIX}/retrieve",
        tags=["koutendb"],
        openapi_extra={
            **declare(Access.READ),
            **operation(body=KoutenRetrieveRequest, ok=Envelope),
        },
    )
    async def post_retrieve(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """The `koutendb.retrieval.v1` envelope: plan over the ring statistics, hybrid
        search restricted to the selected rings before scoring."""
        who = principal(x_api_key, authorization)
        body = validate_strict(loads_strict(await request.body()), KoutenRetrieveRequest)
        envelope = await run_in_threadpool(retrieve_envelope, body, principal=who, ports=ports)
        return _json(envelope)

    @router.post(
        f"{PREFIX}/plan",
        tags=["koutendb"],
        openapi_extra={
            **declare(Access.READ),
            **operation(body=KoutenPlanRequest, ok=PlanResponse),
        },
    )
    async def post_plan(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """The plan `retrieve` would run; nothing is searched."""
        who = principal(x_api_key, authorization)
        body = validate_strict(loads_strict(await request.body()), KoutenPlanRequest)
        plan = await run_in_threadpool(plan_request, body, principal=who, ports=ports)
        return _json(PlanResponse(plan=plan))

    @router.post(
        f"{PREFIX}/validate",
        tags=["koutendb"],
        # Any JSON body is checked; what it is checked against is the envelope.
        openapi_extra={**declare(Access.READ), **operation(body=AnyJson, ok=ValidateResponse)},
    )
    async def post_validate(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """KoutenDB's envelope validator on any JSON body: its messages, in its order."""
        principal(x_api_key, authorization)
        errors = retrieval_envelope_validation_errors(loads_strict(await request.body()))
        return _json(ValidateResponse(valid=not errors, errors=errors))

    @router.get(
        f"{PREFIX}/profiles",
        tags=["koutendb"],
        openapi_extra={**declare(Access.READ), **operation(ok=ProfilesResponse)},
    )
    async def get_profiles(
        namespace: Namespace | None = Query(default=None),
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """The namespace's search profiles, `default` included."""
        who = principal(x_api_key, authorization)
        out = await run_in_threadpool(list_profiles, namespace, principal=who, ports=ports)
        return _json(out)

    @router.put(
        f"{PREFIX}/profiles/{{name}}",
        tags=["koutendb"],
        openapi_extra={**declare(Access.WRITE), **operation(body=ProfileBody, ok=ProfileResponse)},
    )
    async def put_profile_route(
        name: Annotated[str, Path(pattern=_PROFILE_NAME.pattern)],
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """Store a named profile of three words (left out: `default`'s built-in ones)."""
        who = principal(x_api_key, authorization)
        body = validate_strict(loads_strict(await request.body()), ProfileBody)
        out = await run_in_threadpool(
            put_profile, _profile_name(name), body, principal=who, ports=ports
        )
        return _json(out)

    @router.delete(
        f"{PREFIX}/profiles/{{name}}",
        tags=["koutendb"],
        openapi_extra={**declare(Access.WRITE), **operation(ok=ProfilesResponse)},
    )
    async def delete_profile_route(
        name: Annotated[str, Path(pattern=_PROFILE_NAME.pattern)],
        namespace: Namespace | None = Query(default=None),
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """Remove a profile (`default`: restore its built-in words)."""
        who = principal(x_api_key, authorization)
        out = await run_in_threadpool(
            delete_profile, _profile_name(name), namespace, principal=who, ports=ports
        )
        return _json(out)

    @router.get(
        f"{PREFIX}/atlas",
        tags=["koutendb"],
        openapi_extra={**declare(Access.READ), **operation(ok=Atlas)},
    )
    async def get_atlas(
        namespace: Namespace | None = Query(default=None),
        scopeRef: str = Query(default="longterm:objects:current", min_length=1, max_length=256),
        galaxy: Name | None = Query(default=None),
        maxCentroidDims: Annotated[int, Query(ge=0, le=4_096), AS_INT] = 8,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """The galaxy's ring map (implied parents included) from the ring statistics."""
        who = principal(x_api_key, authorization)
        out = await run_in_threadpool(
            atlas, namespace, scopeRef, galaxy, maxCentroidDims, principal=who, ports=ports
        )
        return _json(out)

    @router.post(
        f"{PREFIX}/feedback",
        tags=["koutendb"],
        openapi_extra={
            **declare(Access.READ),
            **operation(body=FeedbackRequest, ok=FeedbackResponse),
        },
    )
    async def post_feedback_route(
        request: Request,
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """Which chunks of a kept envelope were used and which ignored."""
        who = principal(x_api_key, authorization)
        body = validate_strict(loads_strict(await request.body()), FeedbackRequest)
        out = await run_in_threadpool(post_feedback, body, principal=who, ports=ports)
        return _json(out)

    @router.get(
        f"{PREFIX}/recommendations",
        tags=["koutendb"],
        openapi_extra={**declare(Access.READ), **operation(ok=RecommendationsResponse)},
    )
    async def get_recommendations(
        namespace: Namespace | None = Query(default=None),
        scopeRef: str = Query(default="longterm:objects:current", min_length=1, max_length=256),
        galaxy: Name | None = Query(default=None),
        x_api_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        """Budget recommendations per (base ring, profile) from the last day's feedback."""
        who = principal(x_api_key, authorization)
        del scopeRef  # envelopes are kept per namespace and galaxy; accepted for symmetry
        out = await run_in_threadpool(
            recommendations, namespace, galaxy, principal=who, ports=ports
        )
        return _json(out)

    return router
