"""An in-memory copy of a small generation's vectors, scanned exactly.

A Qdrant-family engine brute-forces a segment below its indexing threshold (10 MB of
vectors by default: ~6,660 points of 384 dimensions); at SciFact's 5,183 points that is
qdrant-edge's whole answer, and the request, the scan and the conversion of its points
cost ~2.1 ms where the same exact scan over a float32 matrix in numpy costs ~0.5
(docs/bench/README.md). `FlatVectors` is that matrix, with each row's candidate fields
(`contracts.index.Candidate`) and the columns the common filters test.

The projector's vector adapter keeps it equal to its shard (rows copied from what the
shard stores after each write, under the shard's write lock); the query's vector
adapter scans it. It lives here because both sides use it (as `contracts.vector_payload`
does), and it is pure: numpy and the stdlib, no engine.

Scores: `cosine` of the stored unit vector and the query scaled to unit length,
accumulated in float32 per row (`numpy.einsum`, never a BLAS matrix product: a row's
score does not depend on which other rows are scored with it, so a `scores` lookup of a
few rows and a `search` over all of them agree bit for bit, and no BLAS worker threads
spin on the second core). Equal to the engine's own cosine to float32 rounding (~1e-7).
A `search` over many rows scores them all approximately first (`numpy.vecdot`: one
single-threaded BLAS `sdot` a row, ~0.2 ms for SciFact's 5,183 x 384 against ~0.56 for
the `einsum`) and exactly only those a float32 error bound cannot rule out of the top
(`FlatVectors._shortlist`): the same answer, bit for bit, for ~40 % of the work.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from itertools import compress, repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.index import Candidate, SearchFilter
from contracts.index_fields import DOCUMENT_ID, FACETS, GALAXY, RING, STATUS, hidden_term
from contracts.vector_payload import candidate_of, listed, utc_instant

__all__ = [
    "FlatVectors",
    "any_of",
    "candidate_fields",
    "candidates_at",
    "flat_answerable",
    "flat_capacity",
]

# Documents hidden from the vector lane are never a hit: such a point is not a row.
_HIDDEN = hidden_term("vector")
# A code no interned string has: a missing field (no ring) matches no filter on it.
_ABSENT = -1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A scan shortlists rows by an approximate score first when more than this many times
# `limit` rows match (fewer: scoring them exactly costs less than the extra pass).
_SHORTLIST_FACTOR = 4
# The float32 unit roundoff: a float32 dot product of n terms is within
# n * u / (1 - n * u) * |x|.|y| of the exact one, whatever the order of its sums.
_UNIT_ROUNDOFF = 2.0**-24
# The `Candidate` fields a row keeps: all but the score (index 2), which a scan computes.
_FIELDS = (0, 1, 3, 4)


def flat_capacity(indexing_threshold_kb: int, dimension: int) -> int:
    """The points a generation may hold and still be scanned flat: those its engine would
    brute-force too (a segment under `indexing_threshold_kb` of float32 vectors)."""
    return max(0, indexing_threshold_kb * 1024 // (4 * max(1, dimension)))


class FlatVectors:
    """One generation's points as rows: unit vectors (float32) and candidate fields.

    Rows are written with `put` (the state a point has in the engine, read back from
    it) and `remove`; a removed row's slot is reused. Thread-safe: one lock, held for a
    write or a scan (a scan of 5k rows costs ~0.25 ms).

    `search` and `scores` answer only filters whose every clause is a column here
    (`galaxy`, `status`, `rings`, the `updated_*` bounds and `document_ids`) and return
    None for any other (`visibility`, `facets`, `ring_trees`): the caller asks the
    engine, which answers the same exactly (an engine brute-forces these segments).
    """

    def __init__(self, dimension: int, *, capacity: int = 256) -> None:
        if dimension < 1:
            raise ValueError("dimension must be >= 1")
        self._dimension = dimension
        self._lock = threading.Lock()
        self._rows: dict[str, int] = {}
        self._free: list[int] = []
        self._high = 0
        self._codes: dict[str, int] = {}
        # Each row's candidate fields but the score (`candidate_fields`): a scan's
        # candidates are built from them by C loops alone (`candidates_at`).
        self._fields: npt.NDArray[np.object_] = np.empty((len(_FIELDS), 0), dtype=object)
        self._matrix: npt.NDArray[np.float32] = np.zeros((0, dimension), dtype=np.float32)
        self._galaxy: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)
        self._status: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)
        self._ring: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)
        self._updated: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._live: npt.NDArray[np.bool_] = np.zeros(0, dtype=np.bool_)
        # At least the Euclidean norm of every row ever stored (a removed row's too): the
        # shortlist's error bound. A non-finite row makes it non-finite: no shortlist.
        self._norm_bound = 0.0
        self._allocate(max(1, capacity))

    @property
    def dimension(self) -> int:
        return self._dimension

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, points: Iterable[tuple[Mapping[str, Any], Sequence[float]]]) -> None:
        """Store each `(payload, stored unit vector)` as its document's row (replacing
        the one there); a payload hidden from the vector lane removes the row."""
        with self._lock:
            for payload, vector in points:
                document_id = str(payload[DOCUMENT_ID])
                # A list, or its one term alone (`payload_of(singletons=True)`).
                if _HIDDEN in listed(payload.get(FACETS)):
                    self._remove(document_id)
                    continue
                row = self._rows.get(document_id)
                if row is None:
                    row = self._slot()
                    self._rows[document_id] = row
                candidate = candidate_of(payload, 0.0)
                stored = self._matrix[row]
                stored[:] = np.asarray(vector, dtype=np.float32)
                self._bound_norm(stored)
                for line, index in zip(self._fields, _FIELDS, strict=True):
                    line[row] = candidate[index]
                self._galaxy[row] = self._code(payload.get(GALAXY))
                self._status[row] = self._code(payload.get(STATUS))
                self._ring[row] = self._code(payload.get(RING) or None)
                self._updated[row] = _micros(candidate.updated_at)
                self._live[row] = True

    def remove(self, document_ids: Iterable[str]) -> None:
        with self._lock:
            for document_id in document_ids:
                self._remove(document_id)

    def search(
        self, vector: Sequence[float], filter: SearchFilter, limit: int
    ) -> list[Candidate] | None:
        """The best `limit` rows under `filter`, best first, ties by `document_id`
        (across the `limit` boundary too), scores clamped to [-1, 1]; None if `filter`
        has a clause this copy has no column for."""
        if not flat_answerable(filter):
            return None
        if limit <= 0 or filter.matches_nothing():
            return []
        query = _unit(vector)
        with self._lock:
            mask = self._mask(filter)
            if mask is None:
                return []
            rows = np.flatnonzero(mask)
            if rows.size == 0:
                return []
            if rows.size > _SHORTLIST_FACTOR * limit:
                rows = self._shortlist(rows, query, limit)
            scores = np.clip(np.einsum("ij,j->i", self._matrix[rows], query), -1.0, 1.0)
            if rows.size > limit:
                # Every row tied with the `limit`-th best, so ties are broken by id.
                kth = np.partition(scores, rows.size - limit)[rows.size - limit]
                keep = scores >= kth
                rows, scores = rows[keep], scores[keep]
            order = np.argsort(-scores, kind="stable")
            rows, scores = rows[order], scores[order]
            picked = candidates_at(self._fields, rows, scores)
        if rows.size > 1 and bool((scores[1:] == scores[:-1]).any()):
            picked.sort(key=lambda c: (-c.score, c.document_id))
        return picked[:limit]

    def scores(self, vector: Sequence[float], filter: SearchFilter) -> dict[str, float] | None:
        """`VectorSearch.scores` of the documents `filter.document_ids` lists that match
        the rest of `filter` (clamped cosines); None as for `search`."""
        if not flat_answerable(filter) or filter.document_ids is None:
            return None
        if filter.matches_nothing():
            return {}
        query = _unit(vector)
        with self._lock:
            held = self._rows
            ids = [d for d in filter.document_ids if d in held]
            if not ids:
                return {}
            rows = np.fromiter(map(held.__getitem__, ids), dtype=np.intp, count=len(ids))
            mask = self._mask(filter, with_ids=False)
            if mask is None:
                return {}
            keep = mask[rows]
            if not keep.all():
                rows = rows[keep]
                ids = list(compress(ids, keep.tolist()))
            values = np.einsum("ij,j->i", self._matrix[rows], query)
        # A document listed twice is one key with its one score.
        return dict(zip(ids, np.clip(values, -1.0, 1.0).tolist(), strict=True))

    # -- rows ---------------------------------------------------------------------------

    def _shortlist(
        self, rows: npt.NDArray[np.intp], query: npt.NDArray[np.float32], limit: int
    ) -> npt.NDArray[np.intp]:
        """The `rows` whose exact score may be among the best `limit` or tied with the
        `limit`-th (after clamping): a superset of what the exact scan keeps, so scoring
        only these exactly gives that scan's answer bit for bit.

        The approximate scores are `numpy.vecdot`'s (one BLAS `sdot` a row, single
        threaded, ~2.8x faster than the `einsum` here); both are float32 sums of the
        same products, each within `gamma_n * |row| * |query|` of the exact product
        (`_slack`: any order of summation), so they differ by at most `delta` = twice
        that. At least `limit` rows have an exact score above the approximate
        `limit`-th best minus `delta`; a row the exact scan keeps therefore has an
        approximate score above it minus `2 * delta`. Clamping moves no two scores
        further apart."""
        matrix = self._matrix[: self._high]
        if 2 * rows.size >= self._high:  # most rows: one pass, no copy
            approx = np.vecdot(matrix, query)[rows]
        else:
            approx = np.vecdot(matrix[rows], query)
        kth = float(np.partition(approx, rows.size - limit)[rows.size - limit])
        floor = min(max(kth, -1.0), 1.0) - 2.0 * self._slack()
        if not floor > -1.0:  # a NaN, or a bound too wide to shortlist anything
            return rows
        kept = rows[approx >= floor]
        return kept if kept.size >= limit else rows

    def _slack(self) -> float:
        """`delta`: the most a row's approximate and exact scores can differ, for the
        unit query (float32 rounding of a unit vector: norm below 1 + 2**-20), doubled
        for good measure."""
        n = self._dimension * _UNIT_ROUNDOFF
        gamma = n / (1.0 - n) if n < 0.5 else math.inf
        return 2.0 * (2.0 * gamma * self._norm_bound * (1.0 + 2.0**-20))

    def _bound_norm(self, stored: npt.NDArray[np.float32]) -> None:
        wide = stored.astype(np.float64)
        norm = float(np.sqrt(np.dot(wide, wide)))
        if not math.isfinite(norm):
            norm = math.inf
        self._norm_bound = max(self._norm_bound, norm)

    def _mask(self, filter: SearchFilter, *, with_ids: bool = True) -> npt.NDArray[np.bool_] | None:
        """The live rows `filter` keeps (up to the high-water row); None if none can
        (a value no row holds). Without `with_ids`, `filter.document_ids` is ignored."""
        high = self._high
        mask = self._live[:high].copy()
        if filter.galaxy is not None:
            code = self._codes.get(filter.galaxy)
            if code is None:
                return None
            mask &= self._galaxy[:high] == code
        for column, values in ((self._status, filter.status), (self._ring, filter.rings)):
            if values is not None:
                codes = [self._codes[v] for v in values if v in self._codes]
                if not codes:
                    return None
                mask &= any_of(column[:high], codes)
        if filter.updated_after is not None:
            mask &= self._updated[:high] >= _micros(utc_instant(filter.updated_after))
        if filter.updated_before is not None:
            mask &= self._updated[:high] <= _micros(utc_instant(filter.updated_before))
        if filter.document_ids is not None and with_ids:
            rows = [self._rows[d] for d in filter.document_ids if d in self._rows]
            listed = np.zeros(high, dtype=np.bool_)
            listed[rows] = True
            mask &= listed
        return mask

    def _remove(self, document_id: str) -> None:
        row = self._rows.pop(document_id, None)
        if row is not None:
            self._live[row] = False
            self._fields[:, row] = None
            self._free.append(row)

    def _slot(self) -> int:
        if self._free:
            return self._free.pop()
        if self._high == self._matrix.shape[0]:
            self._allocate(2 * self._high)
        self._high += 1
        return self._high - 1

    def _allocate(self, capacity: int) -> None:
        """Columns of `capacity` rows, the rows held so far copied over."""
        high = self._high
        matrix = np.zeros((capacity, self._dimension), dtype=np.float32)
        galaxy = np.full(capacity, _ABSENT, dtype=np.int32)
        status = np.full(capacity, _ABSENT, dtype=np.int32)
        ring = np.full(capacity, _ABSENT, dtype=np.int32)
        updated = np.zeros(capacity, dtype=np.int64)
        live = np.zeros(capacity, dtype=np.bool_)
        if high:
            matrix[:high] = self._matrix[:high]
            galaxy[:high] = self._galaxy[:high]
            status[:high] = self._status[:high]
            ring[:high] = self._ring[:high]
            updated[:high] = self._updated[:high]
            live[:high] = self._live[:high]
        self._matrix, self._galaxy, self._status = matrix, galaxy, status
        self._ring, self._updated, self._live = ring, updated, live
        fields = np.empty((len(_FIELDS), capacity), dtype=object)
        fields[:, :high] = self._fields[:, :high]
        self._fields = fields

    def _code(self, value: object) -> int:
        if value is None:
            return _ABSENT
        return self._codes.setdefault(str(value), len(self._codes))


def candidates_at(
    fields: npt.NDArray[np.object_], rows: npt.NDArray[np.intp], scores: npt.NDArray[Any]
) -> list[Candidate]:
    """The candidates of `rows` with `scores`, from a copy's candidate fields (a column
    per row, a line per `Candidate` field but the score, in `_FIELDS` order; see
    `candidate_fields`): `tuple.__new__` mapped over the zipped lines, no Python frame
    per candidate (a comprehension over the rows' candidates cost twice this)."""
    document_id, revision, updated_at, status = fields[:, rows].tolist()
    return list(
        map(
            tuple.__new__,
            repeat(Candidate),
            zip(document_id, revision, scores.tolist(), updated_at, status, strict=True),
        )
    )


def candidate_fields(candidates: Sequence[Candidate]) -> npt.NDArray[np.object_]:
    """`candidates`' fields but the score, a column per candidate (`candidates_at`)."""
    fields = np.empty((len(_FIELDS), len(candidates)), dtype=object)
    for line, index in zip(fields, _FIELDS, strict=True):
        line[:] = [candidate[index] for candidate in candidates]
    return fields


def flat_answerable(filter: SearchFilter) -> bool:
    """Whether every clause of `filter` is a column the flat copies keep (galaxy, status,
    rings, the `updated_*` bounds, ids): `FlatVectors` and `FlatLexical` alike."""
    return (
        filter.visibility is None
        and not filter.facets
        and filter.ring_trees is None
        and not filter.phrases
    )


# Up to this many codes, `any_of` compares once per code; past it, `numpy.isin`.
_EQUALITY_CODES = 8


def any_of(column: npt.NDArray[Any], codes: Sequence[int]) -> npt.NDArray[np.bool_]:
    """`numpy.isin(column, codes)`, the same mask: for the few codes a status or ring
    filter names, one equality pass per code. `isin` sets up a sort or a lookup table
    first, ~90 µs for one code over 5k rows against ~2 µs for `column == code`."""
    if not codes or len(codes) > _EQUALITY_CODES:
        found: npt.NDArray[np.bool_] = np.isin(column, codes)
        return found
    mask: npt.NDArray[np.bool_] = column == codes[0]
    for code in codes[1:]:
        mask |= column == code
    return mask


def _unit(vector: Sequence[float]) -> npt.NDArray[np.float32]:
    """The query scaled to unit length (in float64, then float32), as the engine scales
    a cosine query; read-only. Computed once per query tuple: the query-vector cache
    hands every request for one text the same tuple, and a query's search and its
    re-score's lookup pass it again, so the last tuples are known by identity (no hash
    of 384 floats, which cost as much as scaling them)."""
    if not isinstance(vector, tuple):
        return _scaled(vector)
    held = _UNITS.get(id(vector))
    if held is not None and held[0] is vector:
        return held[1]
    unit = _scaled(vector)
    with _UNITS_LOCK:
        if len(_UNITS) >= _UNITS_HELD:
            del _UNITS[next(iter(_UNITS))]
        # The tuple is held with its unit: its id cannot be reused while it is here.
        _UNITS[id(vector)] = (vector, unit)
    return unit


_UNITS: dict[int, tuple[tuple[float, ...], npt.NDArray[np.float32]]] = {}
_UNITS_LOCK = threading.Lock()
_UNITS_HELD = 64  # the most recent query tuples, oldest out first (~13 KiB each)


def _scaled(vector: Sequence[float]) -> npt.NDArray[np.float32]:
    # Each numpy call here lets the GIL go (the lexical search's thread then runs until
    # it lets it go in turn).
    array = np.asarray(vector, dtype=np.float64)
    unit: npt.NDArray[np.float32] = (array / np.sqrt(np.dot(array, array))).astype(np.float32)
    unit.flags.writeable = False
    return unit


def _micros(instant: datetime) -> int:
    """Microseconds since the epoch of an aware datetime, exactly (integers only)."""
    delta = instant - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
