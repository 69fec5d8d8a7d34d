"""Operational views: `GET /healthz` and `GET /v1/readiness`.

Readiness grows with the deployment (projector state, eligibility verdicts, coverage
fallback), so these models name what every deployment answers and allow the rest.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["HealthResponse", "ReadinessResponse", "ScopeReadinessView"]


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
