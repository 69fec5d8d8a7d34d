"""Ring statistics kept with every vector write (issue 12: ring centroids and coherence
are maintained by the projector per generation, never recomputed per query)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.index import IndexDocument
from contracts.stored_vectors import is_encoded
from projector.ports import IndexEvidence, RingStatistics, VectorIndex

__all__ = [
    "RingDelta",
    "RingMember",
    "RingMemberRow",
    "RingStatsVectorIndex",
    "RingVector",
    "contributes",
    "finite_sums",
    "member_vector",
    "merged_sums",
    "newest_changes",
    "recomputed_sums",
    "ring_moves",
    "settled_sums",
]


class RingStatsVectorIndex:
    """A `VectorIndex` that records what it writes in `RingStatistics`.

    Every write path of the projector (batches, snapshot loads, a bulk-load child, the
    hand-over replay, tombstones) goes through `VectorIndex.apply`, so wrapping the one
    index a process writes with keeps each generation's statistics in step with its
    vectors. The engine is written first: a failure in between makes the batch fail and
    be delivered again, and both writes are idempotent on `(document_id, revision)`.

    `stats=None` writes the engine only (tests and tools that need no statistics).
    """

    def __init__(self, inner: VectorIndex, stats: RingStatistics | None) -> None:
        self.inner = inner
        self.stats = stats

    def create(
        self, generation_id: str, dimension: int, *, shards: int = 1, replicas: int = 0
    ) -> None:
        self.inner.create(generation_id, dimension, shards=shards, replicas=replicas)

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


# -- the bookkeeping both `RingStatistics` adapters share (no I/O) ----------------------

RingVector = npt.NDArray[np.float64]
# What a generation holds for a document: (revision, vector or None when deleted, galaxy,
# ring).
RingMember = tuple[int, RingVector | None, str, str]
# A row of `ring_members`: (document_id, revision, deleted, galaxy, ring, float32 bytes).
RingMemberRow = tuple[str, int, bool, str, str, bytes | None]


class RingDelta:
    """Changes to one ring's sums within one `RingStatistics.apply`."""

    __slots__ = ("documents", "unit_sum", "vector_sum")

    def __init__(self) -> None:
        self.documents = 0
        self.vector_sum: RingVector | None = None
        self.unit_sum: RingVector | None = None

    def add(self, vector: RingVector, sign: int) -> None:
        if not contributes(vector):
            # A vector non-finite as float32 (one written before the door refused such
            # vectors) counts in no sum: added or subtracted, it would leave the ring's
            # statistics NaN for good (issue 22). Both directions skip it alike.
            return
        norm = float(np.linalg.norm(vector))
        unit = vector / norm if norm > 0.0 else vector
        self.documents += sign
        if self.vector_sum is None or self.unit_sum is None:
            self.vector_sum = sign * vector
            self.unit_sum = sign * unit
        else:
            self.vector_sum += sign * vector
            self.unit_sum += sign * unit

    def add_rows(self, vectors: Sequence[npt.NDArray[Any]], signs: Sequence[int]) -> None:
        """`add(vector, sign)` for each pair, as whole-matrix operations: one batch's
        moves of a ring cost a few numpy calls, not a dozen per document (issue 24: the
        per-vector calls were ~9 % of the embedded projector's interpreter time). The
        same vectors count (`contributes`), each as float64; sums agree with `add` one
        by one to rounding (the norms are computed row-wise)."""
        if not vectors:
            return
        # A new array (divided in place below), never a caller's.
        matrix = np.array(vectors, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix))
        # A row's norm is finite only when each of its values is (an infinity or a NaN
        # carries into the sum of squares): the one test covers both conditions of
        # `contributes`, without a pass over every value.
        keep = np.isfinite(norms)
        if not keep.all():
            matrix, norms = matrix[keep], norms[keep]
            signs = [s for s, k in zip(signs, keep.tolist(), strict=True) if k]
        if not len(signs):
            return
        # The same sums as before, bit for bit: a product by +1.0 is exact, and the rows
        # are summed in the same order over arrays of the same layout. A batch of new
        # documents (every sign +1, the ingest's case) skips both products and divides in
        # place (issue 24: the projector's ring statistics, ~1.5 us a record of 3.7).
        positive = all(s == 1 for s in signs)
        if positive:
            vector_sum = matrix.sum(axis=0)
        else:
            signed = np.asarray(signs, dtype=np.float64)[:, None]
            vector_sum = (signed * matrix).sum(axis=0)
        scale = norms[:, None]
        if (norms > 0.0).all():
            units = np.divide(matrix, scale, out=matrix if positive else None)
        else:
            units = np.divide(matrix, scale, out=matrix.copy(), where=scale > 0.0)
        unit_sum = units.sum(axis=0) if positive else (signed * units).sum(axis=0)
        self.documents += int(sum(signs))
        if self.vector_sum is None or self.unit_sum is None:
            self.vector_sum, self.unit_sum = vector_sum, unit_sum
        else:
            self.vector_sum += vector_sum
            self.unit_sum += unit_sum


def contributes(vector: RingVector) -> bool:
    """Whether a member's vector counts in its ring's sums: every value and its length
    finite (the door refuses anything else; older stores may hold such vectors)."""
    if not np.isfinite(vector).all():
        return False
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.linalg.norm(vector)))


def finite_sums(sums: tuple[int, RingVector, RingVector]) -> bool:
    """Whether a ring's `(documents, vector_sum, unit_sum)` holds only finite values."""
    return bool(np.isfinite(sums[1]).all()) and bool(np.isfinite(sums[2]).all())


def recomputed_sums(blobs: Iterable[bytes]) -> tuple[int, RingVector, RingVector] | None:
    """A ring's `(documents, vector_sum, unit_sum)` from its live members' stored
    vectors (float32 bytes), those that `contributes` only; None when none does. The
    repair for a stored row that is not finite (written before non-finite vectors were
    skipped): subtraction can never bring a NaN back."""
    delta = RingDelta()
    for blob in blobs:
        delta.add(np.frombuffer(blob, dtype=np.float32).astype(np.float64), 1)
    if delta.vector_sum is None or delta.unit_sum is None:
        return None
    return delta.documents, delta.vector_sum, delta.unit_sum


def settled_sums(
    delta: RingDelta,
    held: tuple[int, bytes, bytes] | None,
    live_vectors: Callable[[], Iterable[bytes]],
) -> tuple[int, RingVector, RingVector] | None:
    """`merged_sums`, unless the stored row or the merged one is not finite: then the
    ring's sums rebuilt from `live_vectors()` (its live members' float32 bytes, read
    after this apply's member rows were written), `documents` 0 when none contributes
    (the row is then deleted). None: nothing to write."""
    sums = merged_sums(delta, held)
    stale = held is not None and not (
        np.isfinite(np.frombuffer(held[1], dtype=np.float64)).all()
        and np.isfinite(np.frombuffer(held[2], dtype=np.float64)).all()
    )
    if stale or (sums is not None and not finite_sums(sums)):
        rebuilt = recomputed_sums(live_vectors())
        empty = np.zeros(0, dtype=np.float64)
        return rebuilt if rebuilt is not None else (0, empty, empty)
    return sums


def newest_changes(
    upserts: Sequence[IndexDocument], deletes: Sequence[tuple[str, int]]
) -> dict[str, tuple[int, IndexDocument | None]]:
    """The newest change per document within one call (a delete at the same revision as
    an upsert removes it, as in the engines): document id → (revision, upsert or None)."""
    changes: dict[str, tuple[int, IndexDocument | None]] = {}
    for upsert in upserts:
        held = changes.get(upsert.document_id)
        if held is None or upsert.revision > held[0]:
            changes[upsert.document_id] = (upsert.revision, upsert)
    for document_id, revision in deletes:
        held = changes.get(document_id)
        if held is None or revision >= held[0]:
            changes[document_id] = (revision, None)
    return changes


def ring_moves(
    changes: dict[str, tuple[int, IndexDocument | None]], members: dict[str, RingMember]
) -> tuple[list[RingMemberRow], dict[tuple[str, str], RingDelta]]:
    """The `ring_members` rows to write and the per-(galaxy, ring) deltas, given what the
    generation holds (`members`): an upsert never replaces its own or a newer revision, a
    delete at r removes what is at r or older and stays as a tombstone at r; a document's
    contribution moves with it. Vectors count as their float32 values. Raises
    `ValueError` for an upsert without a vector."""
    # Each ring's moves in order, applied as one matrix per ring at the end.
    moves: dict[tuple[str, str], tuple[list[npt.NDArray[Any]], list[int]]] = defaultdict(
        lambda: ([], [])
    )
    rows: list[RingMemberRow] = []
    # Past float32's range a value is infinite, not counted (`contributes`). One context
    # for the batch: entering one per document cost a quarter of the conversion.
    with np.errstate(over="ignore"):
        for document_id, (revision, change) in sorted(changes.items()):
            old = members.get(document_id)
            if old is not None and (
                old[0] > revision or (old[0] == revision and change is not None)
            ):
                continue
            if old is not None and old[0] == revision and old[1] is None:
                continue
            if old is not None and old[1] is not None:
                vectors, signs = moves[(old[2], old[3])]
                vectors.append(old[1])
                signs.append(-1)
            if change is None:
                rows.append((document_id, revision, True, "", "", None))
                continue
            if change.vector is None:
                raise ValueError(f"document {document_id} has no vector")
            vector = change.vector
            stored = vector.float32 if is_encoded(vector) else np.asarray(vector, dtype=np.float32)
            vectors, signs = moves[(change.galaxy, change.ring)]
            vectors.append(stored)
            signs.append(1)
            rows.append(
                (document_id, revision, False, change.galaxy, change.ring, stored.tobytes())
            )
    deltas: dict[tuple[str, str], RingDelta] = defaultdict(RingDelta)
    for key, (vectors, signs) in moves.items():
        deltas[key].add_rows(vectors, signs)
    return rows, deltas


def member_vector(deleted: bool, blob: bytes | None) -> RingVector | None:
    """A stored member's vector (float32 bytes) as float64; None for a tombstone."""
    if deleted or blob is None:
        return None
    return np.frombuffer(blob, dtype=np.float32).astype(np.float64)


def merged_sums(
    delta: RingDelta, held: tuple[int, bytes, bytes] | None
) -> tuple[int, RingVector, RingVector] | None:
    """A ring's new (documents, vector_sum, unit_sum) from its stored row (float64
    bytes) plus `delta`; None when the delta is empty (nothing to write). A stored row of
    another dimension is replaced."""
    if delta.vector_sum is None or delta.unit_sum is None:
        return None
    documents, vector_sum, unit_sum = delta.documents, delta.vector_sum, delta.unit_sum
    if held is not None:
        old_vectors = np.frombuffer(held[1], dtype=np.float64)
        if old_vectors.shape == vector_sum.shape:
            documents += int(held[0])
            vector_sum = vector_sum + old_vectors
            unit_sum = unit_sum + np.frombuffer(held[2], dtype=np.float64)
    return documents, vector_sum, unit_sum
