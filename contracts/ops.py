"""Operational views: `GET /healthz`, `GET /v1/readiness` and `GET /v1/scopes`.

Readiness grows with the deployment (projector state, eligibility verdicts, coverage
fallback), so these models name what every deployment answers and allow the rest.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "HealthResponse",
    "NamespaceScopes",
    "ReadinessResponse",
    "ScopeReadinessView",
    "ScopeRefView",
    "ScopesResponse",
]


class HealthResponse(BaseModel):
    """The process answers HTTP; nothing about any tenant."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["ok"] = "ok"


class ScopeReadinessView(BaseModel):
    """One scope's live generation and how far the projector applied the log into it
    (`document_count` is left out for a galaxy-bound key)."""

    model_config = ConfigDict(extra="allow")

    namespace: str
    snapshot_kind: str
    generation_id: str
    applied_position: int
    log_high_water: int
    lag_events: int
    lag_seconds: float


class ReadinessResponse(BaseModel):
    """Per scope readiness; `ready` when every scope (the key's scopes, with API keys
    configured) has no lag and is eligible."""

    model_config = ConfigDict(extra="allow")

    success: Literal[True] = True
    ready: bool
    log_high_water: int
    scopes: list[ScopeReadinessView]


class ScopeRefView(BaseModel):
    """One queryable scope ref: the snapshot kind it reads, where it comes from
    (`builtin`, `configured` by `ORRERY_SCOPES`, or `runtime`: a kind no ref names,
    registered when its first generation went live) and its live generation (None: none
    yet)."""

    model_config = ConfigDict(extra="forbid")

    scope_ref: str
    snapshot_kind: str
    source: Literal["builtin", "configured", "runtime"]
    generation_id: str | None


class NamespaceScopes(BaseModel):
    """The scope refs of one namespace that has a live generation."""

    model_config = ConfigDict(extra="forbid")

    namespace: str
    scopes: list[ScopeRefView]


class ScopesResponse(BaseModel):
    """`GET /v1/scopes`: per namespace (the key's only, with API keys configured), every
    scope ref a query may name."""

    model_config = ConfigDict(extra="forbid")

    success: Literal[True] = True
    namespaces: list[NamespaceScopes]
