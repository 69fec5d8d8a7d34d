"""`RingStatistics` read from the registry database (`ring_stats`, written by the
projector's `projector.adapters.sqlite_ring_stats`; the embedded format)."""

from __future__ import annotations

import numpy as np

from query.adapters.sqlite_routing import _Reader
from query.ports import RingStat

__all__ = ["SqliteRingStats"]


class SqliteRingStats(_Reader):
    """`query.ports.RingStatistics` over the `ring_stats` table (read-only, one
    connection per thread; no table yet = no rings)."""

    def rings(self, generation_id: str, galaxy: str) -> list[RingStat]:
        rows = self._query(
            "SELECT ring, documents, vector_sum, unit_sum FROM ring_stats "
            "WHERE generation_id = ? AND galaxy = ? ORDER BY ring",
            (generation_id, galaxy),
        )
        return [
            RingStat(
                ring=str(ring),
                documents=int(str(documents)),
                vector_sum=np.frombuffer(_bytes(vector_sum), dtype=np.float64),
                unit_sum=np.frombuffer(_bytes(unit_sum), dtype=np.float64),
            )
            for ring, documents, vector_sum, unit_sum in rows
        ]


def _bytes(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError("ring_stats sums are BLOBs")
    return value
