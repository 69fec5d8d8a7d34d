"""The record and `RecordChanged` bytes the vector-decoding properties are built from
(`test_stored_vectors`, `test_packed_vectors`)."""

from __future__ import annotations

from typing import Any

from contracts.events import record_changed_json
from contracts.records import Record


def vector_record(payload: dict[str, Any], vector: list[float] | None, **extra: Any) -> Record:
    """One record of namespace `ns` with `payload` and `vector` (and `extra` fields)."""
    return Record.model_validate(
        {
            "namespace": "ns",
            "snapshot_kind": "objects",
            "item_id": "item-1",
            "revision": 2,
            "payload": payload,
            "text": {"title": "t", "body": "b"},
            "metadata": {"updated_at": "2026-01-01T00:00:00Z", "room": "hall"},
            "vector": vector,
            **extra,
        }
    )


def changed_event(record: Record) -> bytes:
    """`record`'s `RecordChanged` event as the canonical store writes it."""
    return record_changed_json(record.model_dump_json()).encode()
