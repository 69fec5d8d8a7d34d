"""The canonical record: what producers write and what every index is projected from."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from contracts.digests import sha256_json

__all__ = [
    "DOCUMENT_ID_NAMESPACE",
    "Record",
    "RecordMetadata",
    "RecordText",
    "derive_document_id",
    "payload_sha256",
]

# A fixed UUID namespace: document ids derived from it are stable across processes,
# machines and releases. Changing it would re-key every index.
DOCUMENT_ID_NAMESPACE = uuid.UUID("0f5c7a52-6c53-4a8e-9a3e-3d0e6f0b9e42")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(
            "must be 1-128 characters of letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        )
    return value


def _check_ring(value: str) -> str:
    if value and any(not part for part in value.split("/")):
        raise ValueError("ring is a '/'-separated path without empty segments")
    return value


def _aware_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamps must carry a timezone (e.g. '2026-03-19T12:00:00Z')")
    return value.astimezone(UTC)


Name = Annotated[str, AfterValidator(_check_name)]
AwareDatetime = Annotated[datetime, AfterValidator(_aware_utc)]


def derive_document_id(namespace: str, snapshot_kind: str, item_id: str) -> str:
    """The stable document id of `(namespace, snapshot_kind, item_id)`: a UUIDv5 string."""
    return str(uuid.uuid5(DOCUMENT_ID_NAMESPACE, f"{namespace}\x1f{snapshot_kind}\x1f{item_id}"))


def payload_sha256(payload: dict[str, Any]) -> str:
    """Digest of a payload as stored: sha256 over its canonical JSON."""
    return sha256_json(payload)


class RecordText(BaseModel):
    """Lexical fields. `title` is boosted over `body` and `tags` at query time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str = Field(default="", max_length=4_096)
    body: str = Field(default="", max_length=200_000)
    tags: list[str] = Field(default_factory=list, max_length=256)


class RecordMetadata(BaseModel):
    """Filterable metadata. Extra keys are free facets (string, number or bool values)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    status: str = Field(default="active", max_length=64)
    updated_at: AwareDatetime = Field(default_factory=lambda: datetime.now(UTC))
    visibility: list[str] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _facets_are_scalars(self) -> RecordMetadata:
        for key, value in (self.model_extra or {}).items():
            if not _NAME.fullmatch(key):
                raise ValueError(f"facet name {key!r} is not a valid name")
            values = value if isinstance(value, list) else [value]
            if not all(isinstance(v, str | int | float | bool) for v in values):
                raise ValueError(f"facet {key!r} must be a scalar or a list of scalars")
        return self

    def facets(self) -> dict[str, list[str]]:
        """Free facets as lists of strings (how every index stores them)."""
        out: dict[str, list[str]] = {}
        for key, value in sorted((self.model_extra or {}).items()):
            values = value if isinstance(value, list) else [value]
            out[key] = [_facet_string(v) for v in values]
        return out


def _facet_string(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Record(BaseModel):
    """One revision of one document, as a producer writes it.

    Guarantees: `document_id` is set (derived when absent) and stable for
    `(namespace, snapshot_kind, item_id)`; `revision` is a positive integer; `payload` is
    returned to query clients exactly as given.
    """

    model_config = ConfigDict(extra="forbid")

    namespace: Name
    snapshot_kind: Name
    item_id: str = Field(min_length=1, max_length=512)
    revision: int = Field(ge=1, le=2**62)
    document_id: str | None = Field(default=None, min_length=1, max_length=256)
    galaxy: Name = "default"
    ring: Annotated[str, AfterValidator(_check_ring)] = Field(default="", max_length=512)
    payload_schema: str = Field(default="", max_length=256)
    payload: dict[str, Any] = Field(default_factory=dict)
    text: RecordText = Field(default_factory=RecordText)
    metadata: RecordMetadata = Field(default_factory=RecordMetadata)
    vector: list[float] | None = Field(default=None, min_length=1, max_length=4_096)
    deleted: bool = False

    @model_validator(mode="after")
    def _derive_id(self) -> Record:
        if self.document_id is None:
            self.document_id = derive_document_id(self.namespace, self.snapshot_kind, self.item_id)
        return self

    @property
    def doc_id(self) -> str:
        """`document_id`, typed as always present (it is, after validation)."""
        assert self.document_id is not None
        return self.document_id
