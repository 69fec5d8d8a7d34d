"""Ring statistics kept with every vector write (issue 12: ring centroids and coherence
are maintained by the projector per generation, never recomputed per query)."""

from __future__ import annotations

from collections.abc import Sequence

from contracts.index import IndexDocument
from projector.ports import IndexEvidence, RingStatistics, VectorIndex

__all__ = ["RingStatsVectorIndex"]


class RingStatsVectorIndex:
    """A `VectorIndex` that records what it writes in `RingStatistics`.

    Every write path of the projector (batches, snapshot loads, a bulk-load child, the
    hand-over replay, tombstones) goes through `VectorIndex.apply`, so wrapping the one
    index a process writes with keeps each generation's statistics in step with its
    vectors. The engine is written first: a failure in between makes the batch fail and
    be delivered again, and both writes are idempotent on `(document_id, revision)`.

    `stats=None` writes the engine only: server mode on PostgreSQL keeps no ring
    statistics yet, and serves no KoutenDB envelope (docs/koutendb.md).
    """

    def __init__(self, inner: VectorIndex, stats: RingStatistics | None) -> None:
        self.inner = inner
        self.stats = stats

    def create(self, generation_id: str, dimension: int) -> None:
        self.inner.create(generation_id, dimension)

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None:
        self.inner.apply(generation_id, upserts, deletes)
        if self.stats is not None:
            self.stats.apply(generation_id, upserts, deletes)

    def evidence(self, generation_id: str) -> IndexEvidence:
        return self.inner.evidence(generation_id)

    def drop(self, generation_id: str) -> None:
        self.inner.drop(generation_id)
        if self.stats is not None:
            self.stats.drop(generation_id)

    def close(self) -> None:
        if self.stats is not None:
            self.stats.close()
