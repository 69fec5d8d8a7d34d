"""API keys: `ORRERY_API_KEYS="key1=namespace[/galaxy],key2=..."`."""

from __future__ import annotations

import hmac
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from contracts.errors import ErrorCode, OrreryError
from contracts.records import DEFAULT_GALAXY, check_name

__all__ = [
    "ACCESS_EXTENSION",
    "Access",
    "ApiKeyGrant",
    "authenticate",
    "check_admin_key",
    "check_reach",
    "declare",
    "parse_api_keys",
    "resolve_galaxy",
    "sees",
]


class ApiKeyGrant(BaseModel):
    """What one key reaches: one namespace, and optionally only one galaxy of it."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    galaxy: str | None = None


class Access(StrEnum):
    """What a route touches, declared on every route (`x-orrery-access` in OpenAPI).

    `public`: nothing of any tenant (`/healthz`); `read` / `write`: records of the
    namespace (and galaxy) the key reaches; `ops`: operational views, filtered to the
    key's namespaces; `admin`: the generation admin API, with the admin key.
    """

    PUBLIC = "public"
    READ = "read"
    WRITE = "write"
    OPS = "ops"
    ADMIN = "admin"


ACCESS_EXTENSION = "x-orrery-access"


def declare(access: Access) -> dict[str, str]:
    """The `openapi_extra` of a route that touches `access`."""
    return {ACCESS_EXTENSION: access.value}


def check_reach(grant: ApiKeyGrant | None, namespace: str, galaxy: str | None = None) -> None:
    """`FORBIDDEN` unless the key reaches `namespace` (and `galaxy`, when it is bound to
    one). Depends only on the key and the names asked for, never on what exists, so the
    answer tells nothing about other tenants' documents."""
    if grant is None:
        return
    if grant.namespace != namespace:
        raise OrreryError(ErrorCode.FORBIDDEN, f"this API key may not use namespace {namespace!r}")
    if grant.galaxy is not None and galaxy is not None and galaxy != grant.galaxy:
        raise OrreryError(
            ErrorCode.FORBIDDEN,
            f"this API key is limited to galaxy {grant.galaxy!r}",
            {"galaxy": galaxy},
        )


def resolve_galaxy(bound: str | None, requested: str | None) -> str:
    """The one galaxy a request reaches, by the one rule of every route (records,
    ChonkyDB, KoutenDB envelopes, atlas, recommendations, import, dump): the key's
    (`bound`), else the request's, else `default`. `403 forbidden` when a key bound to a
    galaxy names another one; `422 invalid_request` when the name given is not a galaxy
    name (`contracts.records.check_name`: no `/`, `..`, empty, …)."""
    if bound is not None:
        if requested is not None and requested != bound:
            raise OrreryError(
                ErrorCode.FORBIDDEN,
                f"this API key is limited to galaxy {bound!r}",
                {"galaxy": requested[:200]},
            )
        return bound
    if requested is None:
        return DEFAULT_GALAXY
    try:
        return check_name(requested)
    except ValueError as exc:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"galaxy {requested[:100]!r} is not a valid name: {exc}",
            {"galaxy": requested[:200]},
        ) from None


def _presented_key(header_key: str | None, authorization: str | None) -> str | None:
    """The key in its own header, else an `Authorization: Bearer` token, else `None`."""
    if header_key is not None or authorization is None:
        return header_key
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def check_admin_key(configured: str, x_admin_key: str | None, authorization: str | None) -> None:
    """The admin key check of every admin route: `UNAUTHORIZED` without a presented key,
    `FORBIDDEN` for a wrong one or when no admin key is configured (the API is off)."""
    presented = _presented_key(x_admin_key, authorization)
    if presented is None:
        raise OrreryError(
            ErrorCode.UNAUTHORIZED, "send the admin key as 'x-admin-key' or 'Authorization: Bearer'"
        )
    if not configured:
        raise OrreryError(
            ErrorCode.FORBIDDEN,
            "the admin API is disabled: the server has no ORRERY_ADMIN_KEY (it is read at "
            "start: restart the server with it set)",
        )
    if not hmac.compare_digest(configured.encode(), presented.encode()):
        raise OrreryError(ErrorCode.FORBIDDEN, "the admin key is not valid")


def sees(grant: ApiKeyGrant | None, namespace: str, galaxy: str) -> bool:
    """Whether a document of `namespace`/`galaxy` is within the key's reach."""
    if grant is None:
        return True
    return grant.namespace == namespace and grant.galaxy in (None, galaxy)


def parse_api_keys(spec: str) -> dict[str, ApiKeyGrant]:
    """Parse the key list; a malformed entry is a configuration error, never ignored."""
    grants: dict[str, ApiKeyGrant] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, scope = entry.partition("=")
        namespace, _, galaxy = scope.partition("/")
        if not sep or not key.strip() or not namespace.strip():
            raise ValueError(f"ORRERY_API_KEYS entry {entry!r} is not 'key=namespace[/galaxy]'")
        grants[key.strip()] = ApiKeyGrant(
            namespace=namespace.strip(), galaxy=galaxy.strip() or None
        )
    return grants


def authenticate(
    grants: dict[str, ApiKeyGrant], x_api_key: str | None, authorization: str | None
) -> ApiKeyGrant | None:
    """The grant of the presented key; `None` when no keys are configured (open mode)."""
    if not grants:
        return None
    presented = _presented_key(x_api_key, authorization)
    if presented is None:
        raise OrreryError(
            ErrorCode.UNAUTHORIZED, "send an API key as 'x-api-key' or 'Authorization: Bearer'"
        )
    for key, grant in grants.items():
        if hmac.compare_digest(key.encode(), presented.encode()):
            return grant
    raise OrreryError(ErrorCode.UNAUTHORIZED, "the API key is not valid")
