"""Dead letters as both state adapters store them (no I/O): a rejected record's stored
value, and a `DeadLetter` from a `dead_letters` row."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from contracts.events import RecordChanged
from contracts.stored_vectors import PackedVector
from projector.ports import DeadLetter, RejectedRecord, Undecodable

__all__ = ["dead_letter_of", "rejected_value"]


def rejected_value(rejected: RejectedRecord) -> bytes:
    """The `RecordChanged` JSON of a rejected record: what the log carried (a
    `PackedVector` as its values, parsed from its text: pydantic dumps a list)."""
    record = rejected.record
    if isinstance(record.vector, PackedVector):
        record = record.model_copy(update={"vector": record.vector.values()})
    return RecordChanged(record=record).model_dump_json().encode()


def dead_letter_of(row: tuple[Any, ...], parked_at: datetime) -> DeadLetter:
    """A `DeadLetter` from `(seq, consumer, location, position, key, value, headers_json,
    reason, parked_at, namespace, snapshot_kind, document_id, revision)`."""
    seq, consumer, where, position, key, value, headers, reason = row[:8]
    namespace, snapshot_kind, document_id, revision = row[9:13]
    return DeadLetter(
        seq=int(seq),
        consumer=str(consumer),
        message=Undecodable(
            where=str(where),
            position=None if position is None else int(position),
            key=None if key is None else bytes(key),
            value=bytes(value),
            headers=tuple((str(k), base64.b64decode(v)) for k, v in json.loads(str(headers))),
            reason=str(reason),
        ),
        parked_at=parked_at,
        namespace=None if namespace is None else str(namespace),
        snapshot_kind=None if snapshot_kind is None else str(snapshot_kind),
        document_id=None if document_id is None else str(document_id),
        revision=None if revision is None else int(revision),
    )
