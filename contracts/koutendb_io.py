"""KoutenDB's data-moving shapes: JSONL import, `koutendb.dump.v1` dump, and the admin
backup / verify / compact answers (docs/koutendb.md, "Import, dump, backup").

Wire shapes and the pure rules both sides share (ring closure, the payload string);
no I/O. Field names are camelCase like the rest of `/v1/koutendb`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "BACKUP_NAME_PATTERN",
    "DUMP_FORMAT",
    "JSON_PAYLOAD_SCHEMA",
    "MAX_IMPORT_BATCH",
    "MAX_REPORTED_ERRORS",
    "RAW_PAYLOAD_SCHEMA",
    "BackupRequest",
    "BackupResponse",
    "CompactResponse",
    "DumpDocumentLine",
    "DumpMetaLine",
    "DumpRingLine",
    "ImportLine",
    "ImportLineError",
    "ImportResponse",
    "backup_name_problem",
    "payload_codec",
    "ring_closure",
]

DUMP_FORMAT = "koutendb.dump.v1"
# A payload that is a string (KoutenDB's raw codec) is stored as `{"raw": "..."}`.
RAW_PAYLOAD_SCHEMA = "koutendb.raw.v1"
JSON_PAYLOAD_SCHEMA = "koutendb.json.v1"
MAX_IMPORT_BATCH = 10_000
# The first errors of an import are reported with their line numbers; all are counted.
MAX_REPORTED_ERRORS = 1_000

_BACKUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
# `backup_name_problem` as JSON Schema says it (with `maxLength` 128): no `..`, without
# a lookahead (every '.' is followed by another character or ends the name).
BACKUP_NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9_\-]|\.[A-Za-z0-9_\-])*\.?$"


def backup_name_problem(name: str) -> str | None:
    """Why `name` cannot name a backup (a path, `..`, an empty or odd name), or None."""
    if not _BACKUP_NAME.fullmatch(name) or ".." in name:
        return (
            "a backup name is 1-128 letters, digits, '_', '.', '-' starting with a letter or "
            "digit, without '..': a name, never a path"
        )
    return None


def ring_closure(rings: Iterable[str]) -> list[str]:
    """Every ring named and every ring it implies (`a/b/c` → `a`, `a/b`, `a/b/c`), sorted;
    the empty ring (no ring) is left out."""
    out: set[str] = set()
    for ring in rings:
        parts = ring.split("/") if ring else []
        for depth in range(1, len(parts) + 1):
            out.add("/".join(parts[:depth]))
    return sorted(out)


def payload_codec(payload_schema: str, payload: dict[str, Any]) -> tuple[str, str]:
    """(codec, payload string) of a stored payload: `raw` and `payload.raw` for the raw
    schema, else `json` and the object as compact JSON (sorted keys: a dump is stable)."""
    if payload_schema == RAW_PAYLOAD_SCHEMA and isinstance(payload.get("raw"), str):
        return "raw", str(payload["raw"])
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return "json", text


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ImportLine(BaseModel):
    """One line of an import body (JSON lines): any JSON object. A `koutendb.dump.v1`
    line (`meta`, `ring`, `document`) is read as such; any other object is a row mapped
    by `ringField`, `payloadField`, `vecField`, `idField` (docs/koutendb.md)."""

    model_config = ConfigDict(extra="allow")


class ImportLineError(_Out):
    """One line an import could not take: its 1-based line number and why."""

    line: int = Field(ge=1)
    code: str
    message: str
    field: str | None = Field(
        default=None, description="The record field refused (e.g. `vector`), when one is."
    )
    reason: str | None = Field(
        default=None,
        description="Why, machine-readable (e.g. `vector_zero`, `vector_not_finite`, "
        "`keyword_too_long`: see `contracts.admission`).",
    )
    details: dict[str, Any] | None = Field(
        default=None,
        description="What the error envelope's `details` would say (`record_too_large`: "
        "`record_bytes`, `max_record_bytes`).",
    )


class ImportResponse(_Out):
    """What `POST /v1/koutendb/import` did. `read` = non-empty and empty lines read;
    `imported` = records written; `skipped` = blank lines, dump `meta`/`ring` lines and
    rows without a payload; `errors` = lines refused (malformed JSON, an invalid record,
    a stale revision), the first `MAX_REPORTED_ERRORS` of them in `errorLines`; `rings` =
    distinct rings of the imported records; `batches` = store transactions."""

    success: bool = True
    namespace: str
    galaxy: str
    read: int
    imported: int
    skipped: int
    errors: int
    errorLines: list[ImportLineError]
    rings: int
    batches: int
    batchSize: int
    defaultRing: str


class DumpMetaLine(_Out):
    type: Literal["meta"] = "meta"
    format: Literal["koutendb.dump.v1"] = "koutendb.dump.v1"
    galaxy: str
    namespace: str
    snapshotKind: str
    documents: int
    rings: int


class DumpRingLine(_Out):
    type: Literal["ring"] = "ring"
    name: str


class DumpDocumentLine(_Out):
    """One live document. `id` is the record's item id without its `{galaxy}:` prefix
    (so dump → import keeps identities); `payload` is the payload string of `codec`;
    `vec` only for records that carry their own vector."""

    type: Literal["document"] = "document"
    id: str
    ring: str
    payload: str
    codec: Literal["raw", "json"]
    vec: list[float] | None = None


class BackupRequest(BaseModel):
    """`POST /v1/admin/backups`: the backup's name (a directory under `<data>/backups`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(
        min_length=1, max_length=128, json_schema_extra={"pattern": BACKUP_NAME_PATTERN}
    )

    @field_validator("name")
    @classmethod
    def _a_name(cls, value: str) -> str:
        problem = backup_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class BackupResponse(_Out):
    """A backup (or its verification): `items` = record revisions it holds, `liveItems`
    = live documents, `generations` = registry rows, `bytes` = its size on disk."""

    success: bool = True
    name: str
    path: str
    items: int
    liveItems: int
    generations: int
    bytes: int
    verified: bool = False


class CompactResponse(_Out):
    """`POST /v1/admin/compact`: sizes of the canonical database before and after, the
    record revisions left (`items`: live heads, tombstones and revisions a generation
    still lists), and what was dropped. A deleted document keeps only its tombstone (its
    revision floor; docs/koutendb.md)."""

    success: bool = True
    beforeBytes: int
    afterBytes: int
    items: int
    liveItems: int
    tombstones: int
    droppedRevisions: int
    droppedOutboxRows: int
