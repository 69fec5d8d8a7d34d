"""API keys: `ORRERY_API_KEYS="key1=namespace[/galaxy],key2=..."`."""

from __future__ import annotations

import hmac

from pydantic import BaseModel, ConfigDict

from contracts.errors import ErrorCode, OrreryError

__all__ = ["ApiKeyGrant", "authenticate", "parse_api_keys"]


class ApiKeyGrant(BaseModel):
    """What one key reaches: one namespace, and optionally only one galaxy of it."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    galaxy: str | None = None


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
    presented = x_api_key
    if presented is None and authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            presented = token.strip()
    if presented is None:
        raise OrreryError(
            ErrorCode.UNAUTHORIZED, "send an API key as 'x-api-key' or 'Authorization: Bearer'"
        )
    for key, grant in grants.items():
        if hmac.compare_digest(key.encode(), presented.encode()):
            return grant
    raise OrreryError(ErrorCode.UNAUTHORIZED, "the API key is not valid")
