"""The bulk write API: `POST /v1/records`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.errors import ErrorBody

__all__ = ["WriteItem", "WriteResponse"]


class WriteItem(BaseModel):
    """The outcome of one record of a batch (`status` 201 accepted, 409 conflict)."""

    model_config = ConfigDict(extra="forbid")

    index: int
    document_id: str
    revision: int
    status: Literal[201, 409]
    position: int | None = Field(default=None, description="Outbox position when accepted.")
    error: ErrorBody | None = None


class WriteResponse(BaseModel):
    """Per-record outcomes. `high_water` is the newest outbox position after the write."""

    model_config = ConfigDict(extra="forbid")

    success: bool
    accepted: int
    rejected: int
    high_water: int
    items: list[WriteItem]
