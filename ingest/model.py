"""Pure rules of the canonical store: which revisions are accepted."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contracts.records import Record, payload_sha256
from contracts.stored_vectors import float32_wire

__all__ = [
    "Decision",
    "FlowLimits",
    "Outcome",
    "decide_revision",
    "stored_columns",
    "vector_wire",
]


class Decision(StrEnum):
    ACCEPTED = "accepted"
    CONFLICT = "conflict"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one record of a batch."""

    index: int
    document_id: str | None
    revision: int | None
    decision: Decision
    position: int | None = None
    current_revision: int | None = None
    message: str = ""
    code: str | None = None


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """How the write path paces writers against the projector, per namespace (embedded
    deployment, and server mode on PostgreSQL).

    - `max_lag_events`: a batch is written only while the projector is at most this many
      events behind the log (0: no bound). A writer finding it further behind waits, up
      to `backlog_wait_seconds`, and is then refused (`503 ingest_backlog`, nothing
      written). So, with writers admitted one at a time, an acknowledged record is at
      most `max_lag_events + max_batch` events from searchable.
    - `searchable_wait_seconds`: how long a write that asked to wait until searchable
      (`?wait=searchable`) waits for the projector to apply it.
    """

    max_lag_events: int = 4_096
    backlog_wait_seconds: float = 30.0
    searchable_wait_seconds: float = 30.0


def decide_revision(incoming: int, current: int | None) -> Decision:
    """A revision is accepted only if it is strictly newer than the stored head.

    Equal revisions are conflicts too: a revision names exactly one content.
    """
    if current is None or incoming > current:
        return Decision.ACCEPTED
    return Decision.CONFLICT


def strings_in(value: Any) -> list[str]:
    """Every string inside a JSON value, depth first in document order (the text a
    payload without text of its own is indexed by)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in strings_in(v)]
    if isinstance(value, list):
        return [t for v in value for t in strings_in(v)]
    return []


def vector_wire(record: Record) -> bytes | None:
    """What a canonical store keeps of `record`'s vector beside its JSON (`vector_f32`):
    its float32 bytes (`contracts.stored_vectors.float32_wire`), packed from the values
    the door validated; None for a tombstone or a record without a vector. The relay
    ships them (`contracts.events.VECTOR_HEADER`): the projector reads the vector from
    them and never parses its decimals (issue 24)."""
    vector = record.vector
    if vector is None or record.deleted:
        return None
    return float32_wire(vector)


def stored_columns(record: Record) -> tuple[str, int, str, str, str, str, bool, str]:
    """The columns a canonical store keeps of `record` before its JSON, in their order:
    `document_id, revision, namespace, snapshot_kind, item_id, galaxy, deleted,
    payload_sha256` (both stores: SQLite and PostgreSQL)."""
    return (
        record.doc_id,
        record.revision,
        record.namespace,
        record.snapshot_kind,
        record.item_id,
        record.galaxy,
        record.deleted,
        payload_sha256(record.payload),
    )
