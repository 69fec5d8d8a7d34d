"""The bulk write API: `POST /v1/records`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from contracts.errors import ErrorBody
from contracts.records import Record

__all__ = ["WriteBatch", "WriteItem", "WriteRequest", "WriteResponse"]


class WriteBatch(BaseModel):
    """`{"records": [...]}`: the object form of a batch."""

    model_config = ConfigDict(extra="forbid", strict=True)

    records: list[Record] = Field(min_length=1)


class WriteRequest(RootModel[Annotated[list[Record], Field(min_length=1)] | WriteBatch]):
    """The body of `POST /v1/records`: a JSON array of records or `{"records": [...]}`,
    at most `ORRERY_MAX_BATCH` of them (`413 batch_too_large` beyond), written in one
    transaction."""


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
    """Per-record outcomes. `high_water` is the newest log position this write's own
    records took (0 when none was accepted): the write is searchable once readiness shows
    its scope's `applied_position` at or past it. Never the log's global position."""

    model_config = ConfigDict(extra="forbid")

    success: bool
    accepted: int
    rejected: int
    high_water: int
    items: list[WriteItem]
    searchable: bool | None = Field(
        default=None,
        description="With ?wait=searchable: whether every accepted record was searchable "
        "before the answer (false: the wait ran out; the records are written and will "
        "be). Absent otherwise.",
    )
