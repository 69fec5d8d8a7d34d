"""`RingStatistics` read from PostgreSQL (`ring_stats`, written by the projector's
`projector.adapters.postgres_ring_stats`; server mode with `ORRERY_DATABASE_URL`)."""

from __future__ import annotations

import numpy as np

from query.adapters.postgres_routing import PostgresReads
from query.ports import RingStat

__all__ = ["PostgresRingStats"]


class PostgresRingStats:
    """`query.ports.RingStatistics` over the `ring_stats` table (one statement per
    read on the worker's pooled connections)."""

    def __init__(self, reads: PostgresReads) -> None:
        self._reads = reads

    def rings(self, generation_id: str, galaxy: str) -> list[RingStat]:
        rows = self._reads.query(
            "SELECT ring, documents, vector_sum, unit_sum FROM ring_stats "
            "WHERE generation_id = %s AND galaxy = %s ORDER BY ring",
            (generation_id, galaxy),
        )
        return [
            RingStat(
                ring=str(ring),
                documents=int(documents),
                vector_sum=np.frombuffer(bytes(vector_sum), dtype=np.float64),
                unit_sum=np.frombuffer(bytes(unit_sum), dtype=np.float64),
            )
            for ring, documents, vector_sum, unit_sum in rows
        ]
