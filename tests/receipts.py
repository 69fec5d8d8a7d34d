"""One qualification receipt for tests that need one and care about a few fields."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from contracts.qualification import QualificationReceipt, QualificationThresholds

__all__ = ["receipt"]


def receipt(**fields: Any) -> QualificationReceipt:
    """A receipt of generation `g2` (3 shards, 1 replica, caps 100/100/10, no slices,
    passed), `fields` over those, with its id."""
    made: dict[str, Any] = {
        "generation_id": "g2",
        "namespace": "ns",
        "snapshot_kind": "objects",
        "descriptor_digest": "d",
        "position": 3,
        "shards": 3,
        "replicas": 1,
        "caps": {"lexical": 100, "vector": 100, "top_k": 10},
        "profiles": {"rrf@2": "x"},
        "sample_digest": "s",
        "sample_size": 0,
        "slices": (),
        "thresholds": QualificationThresholds(),
        "passed": True,
        "created_at": datetime(2026, 12, 2, tzinfo=UTC),
        **fields,
    }
    return QualificationReceipt(**made).with_id()
