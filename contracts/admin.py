"""The operator API over generations: `/v1/admin/generations…` and `orrery gen …`.

Every call needs the admin key (`ORRERY_ADMIN_KEY`), sent as `x-admin-key` or
`Authorization: Bearer`. The same models are printed by `orrery gen … --json`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.generations import EvidenceCheck, GenerationDescriptor, GenerationState
from contracts.names import Namespace
from contracts.qualification import QualificationReceipt, ReceiptList
from contracts.records import Name
from contracts.wire import JsonInt

__all__ = [
    "BuildProgress",
    "BuildRequest",
    "DescriptorResponse",
    "GcReport",
    "GcRequest",
    "GcResponse",
    "GenerationListResponse",
    "GenerationRow",
    "GenerationView",
    "GenerationViewResponse",
    "PromoteReport",
    "PromoteResponse",
    "QualifyResponse",
    "ReceiptListResponse",
    "RollbackRequest",
    "VerifyResponse",
]


class _Strict(BaseModel):
    # Strict types: `{"keep": false}` is not `{"keep": 0}`.
    model_config = ConfigDict(extra="forbid", strict=True)


class BuildRequest(_Strict):
    """A build of a new generation of one scope. `shards` / `replicas` override the
    deployment's (`ORRERY_INDEX_SHARDS`, `ORRERY_INDEX_REPLICAS`, `ORRERY_INDEX_TOPOLOGY`)
    for this generation; embedded mode takes only 1 / 0."""

    namespace: Namespace
    snapshot_kind: Name
    shards: JsonInt | None = Field(
        default=None, ge=1, le=64, json_schema_extra={"minimum": 1, "maximum": 64}
    )
    replicas: JsonInt | None = Field(
        default=None, ge=0, le=8, json_schema_extra={"minimum": 0, "maximum": 8}
    )
    # A scope that never held a record is refused (`invalid_state`): usually a typo.
    allow_empty: bool = False


class RollbackRequest(_Strict):
    namespace: Namespace
    snapshot_kind: Name


class GcRequest(_Strict):
    keep: JsonInt = Field(default=1, ge=0, le=1_000)


class GenerationRow(BaseModel):
    """One registry row: the facts that change with every write, next to the state."""

    model_config = ConfigDict(frozen=True)

    generation_id: str
    namespace: str
    snapshot_kind: str
    state: GenerationState
    live: bool
    created_at: datetime
    document_count: int
    applied_position: int
    commit_seq: int
    descriptor_digest: str
    indexes_dropped: bool = False
    heartbeat_at: datetime | None = None


class BuildProgress(BaseModel):
    """A build running in this process (`phase`: snapshot, load, catch_up, seal, done,
    failed, aborted)."""

    model_config = ConfigDict(frozen=True)

    generation_id: str
    phase: str
    done: int
    total: int
    rate_per_s: float
    elapsed_s: float
    error: str | None = None


class GenerationView(BaseModel):
    """`orrery gen show`: the row, the full stored descriptor, recent evidence checks and
    the running build (if it runs in the answering process)."""

    model_config = ConfigDict(frozen=True)

    row: GenerationRow
    descriptor: GenerationDescriptor
    checks: list[EvidenceCheck] = Field(default_factory=list)
    build: BuildProgress | None = None
    receipts: list[QualificationReceipt] = Field(default_factory=list)


class PromoteReport(BaseModel):
    """The outcome of a promote or a rollback: the pointer flip and the alias mirrors.

    `flip_ms` times the one registry write that switched the pointer. `aliases` maps an
    engine to what happened to its native alias (`"orrery-…: pointed at …"`, or
    `"skipped: …"` for engines without aliases, or `"failed: …"` — the registry pointer
    is the truth either way).
    """

    model_config = ConfigDict(frozen=True)

    action: Literal["promote", "rollback"]
    namespace: str
    snapshot_kind: str
    generation_id: str
    previous_generation_id: str | None
    switched_at: datetime
    flip_ms: float
    lag_events: int
    aliases: dict[str, str] = Field(default_factory=dict)
    receipt_id: str | None = None


class GcReport(BaseModel):
    """Generations whose engine indexes `gc` dropped, and those it kept."""

    model_config = ConfigDict(frozen=True)

    dropped: list[str]
    kept: list[str]


# The admin API's answers: `{"success": true, ...}` around the models above.


class GenerationListResponse(BaseModel):
    """`GET /v1/admin/generations`: registry rows."""

    success: Literal[True] = True
    generations: list[GenerationRow]


class GenerationViewResponse(GenerationView):
    """`GET …/{id}` and `POST …/build` (202): the generation's view."""

    success: Literal[True] = True


class PromoteResponse(BaseModel):
    """`POST …/{id}/promote` and `POST …/rollback`."""

    success: Literal[True] = True
    report: PromoteReport


class QualifyResponse(BaseModel):
    """`POST …/{id}/qualify`: the stored receipt (passing or not)."""

    success: Literal[True] = True
    receipt: QualificationReceipt


class ReceiptListResponse(ReceiptList):
    """`GET …/{id}/receipts`."""

    success: Literal[True] = True


class GcResponse(BaseModel):
    """`POST …/gc`."""

    success: Literal[True] = True
    report: GcReport


class VerifyResponse(BaseModel):
    """`POST …/{id}/verify`: 200 either way; `verified` says whether the evidence
    matched, `state` is the generation's state afterwards."""

    success: Literal[True] = True
    verified: bool
    state: GenerationState
    check: EvidenceCheck


class DescriptorResponse(BaseModel):
    """`POST …/{id}/retire` and `POST …/{id}/abort`: the descriptor afterwards."""

    success: Literal[True] = True
    descriptor: GenerationDescriptor
