"""Nearest-neighbour search over the qdrant-edge shards the projector writes.

qdrant-edge allows one process per shard directory, so this adapter does not open
shards: it is given `shard_provider` (in the embedded deployment,
`QdrantEdgeVectorIndex.shard_for` of the projector's index in the same process), which
returns the open shard of a generation or raises `KeyError` for an unknown one.

The payload it reads and filters on is written by
`projector.adapters.qdrant_edge_vectors` as `contracts.vector_payload` lays it out.
"""

from __future__ import annotations

import functools
import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt
from qdrant_edge import (
    CountRequest,
    EdgeShard,
    FieldCondition,
    Filter,
    HasIdCondition,
    MatchAny,
    MatchValue,
    PayloadSchemaType,
    PayloadSelector,
    Query,
    QueryRequest,
    RangeDateTime,
    RangeFloat,
    ScoredPoint,
    SearchParams,
)

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.flat_vectors import FlatVectors
from contracts.index import Candidate, SearchFilter, id_lookup_size
from contracts.index_fields import (
    DOCUMENT_ID,
    FACETS,
    GALAXY,
    REVISION,
    RING,
    RING_PATH,
    STATUS,
    UPDATED_AT,
    VISIBILITY,
    hidden_term,
    is_canonical_uuid,
)
from contracts.point_ids import PointIds, int_point_id
from contracts.point_table import PointTable
from contracts.timing import engine_call
from contracts.vector_payload import (
    RETURNED_FIELDS,
    VECTOR_NAME,
    best_first,
    candidate_of,
    check_query_vector,
    cosine_score,
    facet_terms,
    point_id,
    utc_micros,
    utc_timestamp,
    with_id,
)

if TYPE_CHECKING:
    from qdrant_edge import ConditionType, PointId

__all__ = [
    "ANY_IDS",
    "DEFAULT_MEMO_BYTES",
    "DEFAULT_MEMO_TENANTS",
    "FLAT_ENGINE",
    "FlatProvider",
    "IdsProvider",
    "PointsProvider",
    "QdrantEdgeVectorSearch",
    "ShardProvider",
    "VectorMemo",
    "edge_filter",
]

DEPENDENCY = "qdrant-edge"
# The `QueryPlan.engine_ms` key of qdrant-edge's query calls.
ENGINE = "qdrant_edge_query"

_T = TypeVar("_T")

# `PayloadSelector.Include` is cheaper than the same list of keys as `with_payload`:
# 0.56 -> 0.47 ms for a top-101 request at 10k (the engine call, payloads converted).
_RETURNED = PayloadSelector.Include(list(RETURNED_FIELDS))

ShardProvider = Callable[[str], EdgeShard]
"""Returns the open shard of a generation; raises `KeyError` if there is none."""

PointsProvider = Callable[[str], PointTable | None]
"""Returns the point table of a generation (its points' candidate fields by point id), or
None; raises `KeyError` if there is no such generation
(`QdrantEdgeVectorIndex.points_for`)."""

IdsProvider = Callable[[str], PointIds]
"""Returns how a generation maps document ids to point ids (`contracts.point_ids`); raises
`KeyError` if there is no such generation (`QdrantEdgeVectorIndex.ids_for`). Without one,
a listed document is looked up at both its integer and its UUID point id."""

FlatProvider = Callable[[str], FlatVectors | None]
"""Returns the in-memory copy of a generation to scan instead of its shard, or None;
raises `KeyError` if there is no such generation (`QdrantEdgeVectorIndex.flat_for`)."""

# The `QueryPlan.engine_ms` key of scans of an in-memory copy (`FlatVectors`).
FLAT_ENGINE = "flat_vectors"

# What the re-score's vectors may hold per tenant: 256 MiB is ~167k rows of 384
# dimensions (1,600 bytes a row), so a generation of up to ~167k points is memoized.
DEFAULT_MEMO_BYTES = 256 << 20
# Tenants with vectors held at once; past that the least recently used one is dropped
# whole, so the memo holds at most DEFAULT_MEMO_TENANTS × DEFAULT_MEMO_BYTES (1 GiB).
DEFAULT_MEMO_TENANTS = 4

# What a memo fill reads besides the vector: the revision it belongs to.
_REVISION_ONLY = PayloadSelector.Include([REVISION])
_DOCUMENT_ONLY = PayloadSelector.Include([DOCUMENT_ID])
_REVISION_AND_DOCUMENT = PayloadSelector.Include([REVISION, DOCUMENT_ID])


class VectorMemo:
    """The stored (unit) vectors of documents at one revision, kept per tenant
    (namespace) and generation as rows of one float32 matrix (`_Rows`): a lookup is one
    dict read per document and one gather of the rows, scored without joining bytes.

    Bounded per generation, not per entry: each row (a vector of `dimension` float32 and
    ~64 bytes of key and slot) counts against its tenant's `max_bytes`, rows of earlier
    revisions too (a rewritten document gets a new row; its old one stays until its
    generation is dropped). A fill that would pass the tenant's bound first drops the
    tenant's least recently used *other* generations whole; if the generation alone
    fills the bound, it is dropped whole and filled again from empty. At most
    `max_tenants` tenants are held (past that the least recently used tenant is dropped
    whole), so one tenant's fills never evict another's rows while at most `max_tenants`
    tenants are held (`test_another_tenants_fills_never_evict_a_tenants_entries`), and
    the memo holds at most `max_tenants × max_bytes` of rows. A generation's matrix
    reserves address space for as many rows as the bound allows (`max_bytes // (64 + 4 ×
    dimension)`: ~167k of 384 dimensions at 256 MiB) and is committed page by page as
    rows are filled (rows are filled in order), so its resident size follows the rows
    filled, not the reservation. A generation larger than the bound is not memoized at
    all (`QdrantEdgeVectorSearch._memoized`): a 1M-point generation of 384 dimensions
    (1.5 GB of vectors) keeps the engine's lookups.

    Correct by construction rather than by invalidation: a generation's vector of a
    document at a revision never changes (another embedder is another generation), so a
    row is used only for the very revision a caller names, and a newer revision is a
    miss whose fill gets a row of its own. Thread-safe: fills and the choice of a
    generation's rows are under one lock; lookups read rows that are written before they
    are published and never written again (a dropped generation's rows stay valid for a
    lookup that holds them). Lookups and fills never call the engine."""

    def __init__(
        self, max_bytes: int = DEFAULT_MEMO_BYTES, *, max_tenants: int = DEFAULT_MEMO_TENANTS
    ) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if max_tenants < 1:
            raise ValueError("max_tenants must be >= 1")
        self._max_bytes = max_bytes
        self._max_tenants = max_tenants
        # tenant -> generation -> rows, each least recently used first.
        self._tenants: OrderedDict[str, OrderedDict[str, _Rows]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        """The bound of each tenant's rows."""
        return self._max_bytes

    @property
    def max_tenants(self) -> int:
        return self._max_tenants

    def get_many(
        self,
        tenant: str,
        generation_id: str,
        documents: Sequence[str],
        revisions: Mapping[str, int],
    ) -> tuple[list[str], npt.NDArray[np.float32] | None, list[str]]:
        """For each of `documents` at its revision in `revisions`: the documents `tenant`
        holds at that revision and their vectors (one float32 row each, in the same
        order; None when none is held), and the others (none named in `revisions`
        included), in the order asked."""
        with self._lock:
            rows = self._find(tenant, generation_id)
        if rows is None:
            return [], None, list(documents)
        # One C-level pass per lookup (a generator of pairs cost ~3x as much per id).
        found = list(map(rows.row_of.get, documents))
        wanted = list(map(revisions.get, documents))
        revision_at = rows.revisions
        held: list[str] = []
        at: list[int] = []
        missing: list[str] = []
        for document_id, row, revision in zip(documents, found, wanted, strict=True):
            if row is not None and revision_at[row] == revision:
                held.append(document_id)
                at.append(row)
            else:
                missing.append(document_id)
        if not at:
            return held, None, missing
        return held, rows.matrix[np.array(at, dtype=np.intp)], missing

    def put_many(
        self,
        tenant: str,
        generation_id: str,
        vectors: Iterable[tuple[str, int, npt.NDArray[np.float32]]],
    ) -> None:
        """Hold each `(document, revision, vector)` (float32, one dimension) as
        `tenant`'s, within the bounds above; a vector of another dimension than the
        generation's rows, or one whose row alone passes the bound, is not kept."""
        with self._lock:
            for document_id, revision, vector in vectors:
                self._put(tenant, generation_id, document_id, revision, vector)

    def put(
        self,
        tenant: str,
        generation_id: str,
        document_id: str,
        revision: int,
        vector: npt.NDArray[np.float32],
    ) -> None:
        self.put_many(tenant, generation_id, [(document_id, revision, vector)])

    def __len__(self) -> int:
        """The documents held (at one revision each), over every tenant."""
        with self._lock:
            return sum(len(r.row_of) for g in self._tenants.values() for r in g.values())

    def held_bytes(self, tenant: str) -> int:
        """What `tenant`'s rows count against its bound (rows of earlier revisions too)."""
        with self._lock:
            generations = self._tenants.get(tenant)
            return 0 if generations is None else sum(r.nbytes() for r in generations.values())

    def _find(self, tenant: str, generation_id: str) -> _Rows | None:
        generations = self._tenants.get(tenant)
        if generations is None:
            return None
        self._tenants.move_to_end(tenant)
        rows = generations.get(generation_id)
        if rows is not None:
            generations.move_to_end(generation_id)
        return rows

    def _put(
        self,
        tenant: str,
        generation_id: str,
        document_id: str,
        revision: int,
        vector: npt.NDArray[np.float32],
    ) -> None:
        dimension = vector.shape[0]
        capacity = self._max_bytes // _row_bytes(dimension)
        if capacity == 0:
            return
        generations = self._tenants.get(tenant)
        if generations is None:
            generations = self._tenants[tenant] = OrderedDict()
            while len(self._tenants) > self._max_tenants:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(tenant)
        rows = generations.get(generation_id)
        if rows is None:
            rows = generations[generation_id] = _Rows(dimension, capacity)
        generations.move_to_end(generation_id)
        if rows.dimension != dimension:
            return
        row = rows.row_of.get(document_id)
        if row is not None and rows.revisions[row] == revision:
            return
        if rows.used == rows.capacity:
            # The generation alone fills the bound: dropped whole, filled again from empty.
            rows = generations[generation_id] = _Rows(dimension, capacity)
        # Then room is made from the tenant's other generations, least recently used
        # first (this one is the most recent: never reached while others are left).
        held = sum(r.nbytes() for r in generations.values())
        while held + _row_bytes(dimension) > self._max_bytes:
            oldest, dropped = next(iter(generations.items()))
            del generations[oldest]
            held -= dropped.nbytes()
        rows.append(document_id, revision, vector)


class _Rows:
    """One tenant's vectors of one generation: row `i` of `matrix` holds a document's
    vector at `revisions[i]`; `row_of` maps a document to its latest row. Rows are only
    appended (under the memo's lock): a row is written before `row_of` names it and
    never written again."""

    __slots__ = ("capacity", "dimension", "matrix", "revisions", "row_of", "used")

    def __init__(self, dimension: int, capacity: int) -> None:
        self.dimension = dimension
        self.capacity = capacity
        # `np.empty`: address space only; pages are committed as rows are written.
        self.matrix: npt.NDArray[np.float32] = np.empty((capacity, dimension), np.float32)
        self.revisions: list[int] = []
        self.row_of: dict[str, int] = {}
        self.used = 0

    def nbytes(self) -> int:
        return self.used * _row_bytes(self.dimension)

    def append(self, document_id: str, revision: int, vector: npt.NDArray[np.float32]) -> None:
        row = self.used
        self.matrix[row] = vector
        self.revisions.append(revision)
        self.used = row + 1
        self.row_of[document_id] = row


def _row_bytes(dimension: int) -> int:
    """What a row counts against the bound: its vector and ~64 bytes of key and slot."""
    return 64 + 4 * dimension


def _as_vector(values: Sequence[Any]) -> npt.NDArray[np.float32]:
    """A stored vector as the memo keeps it: float32, native byte order."""
    return np.asarray(values, dtype=np.float32)


def _unit(vector: Sequence[float]) -> npt.NDArray[np.float64]:
    """`vector` scaled to unit length (float64), as the engine prepares a cosine query.

    The last vector scaled on this thread is remembered by identity (the checked list
    `check_query_vector` hands out again for the same query; never changed), so a
    query's lookups scale it once."""
    last: tuple[Sequence[float], npt.NDArray[np.float64]] | None = getattr(_UNIT, "last", None)
    if last is not None and last[0] is vector:
        return last[1]
    array = np.asarray(vector, dtype=np.float64)
    unit = array / math.sqrt(float(np.dot(array, array)))
    unit.flags.writeable = False
    _UNIT.last = (vector, unit)
    return unit


# Per thread: `(vector, its unit float64 array)` of the last `_unit` call.
_UNIT = threading.local()


class QdrantEdgeVectorSearch:
    """Cosine nearest neighbours over one generation's qdrant-edge shard.

    Guarantees (those of `query.ports.VectorSearch`):
    - The filter is part of the engine request (payload indexes), never applied
      afterwards, so `limit` results come back whenever that many documents match.
      It restricts and never changes scores. A filter with an empty list returns [].
    - At most `limit` candidates, best first, ties broken by `document_id` ascending
      (also across the `limit` boundary); scores are cosine similarities in [-1, 1].
    - Exact on segments without HNSW (qdrant-edge brute-forces them); on HNSW segments
      approximate with `ef = max(hnsw_ef, limit + 1)`.
    - With a `flat_provider`, a generation it offers a copy of (one the engine would
      brute-force anyway) is scanned in memory instead (`contracts.flat_vectors`: the
      same exact answer to float32 rounding, without the engine call), for every filter
      the copy has columns for; others go to the engine.
    - With a `points_provider`, a generation that has a point table is asked for ids and
      scores only, and the candidates' fields are read from the table
      (`contracts.point_table`: the same fields the payload holds, at the moment of the
      engine's answer; a write in between makes it ask again, with payloads).
    - Integer point ids (`contracts.point_ids`): listed documents are looked up at the
      point ids the `ids_provider` gives (without one: at both their integer and UUID
      ids), and a returned integer point whose document (from the point table or its
      payload) is not a listed one is dropped (an absent document's integer id may be
      held by another document's point), so listed lookups answer as with UUID ids.

    Errors: unknown generation -> `COVERAGE_UNAVAILABLE`; a query vector of the wrong
    dimension -> `EMBEDDER_MISMATCH`; non-finite or zero vector, naive datetime bounds ->
    `INVALID_REQUEST`; any other engine failure -> `DependencyUnavailable`.
    """

    def __init__(
        self,
        shard_provider: ShardProvider,
        *,
        hnsw_ef: int = 128,
        memo: VectorMemo | None = None,
        flat_provider: FlatProvider | None = None,
        points_provider: PointsProvider | None = None,
        ids_provider: IdsProvider | None = None,
    ) -> None:
        self._shard_provider = shard_provider
        self._ids_provider = ids_provider
        self._flat_provider = flat_provider
        self._points_provider = points_provider
        self._hnsw_ef = hnsw_ef
        self._memo = memo
        self._memo_serves: dict[str, bool] = {}
        # Per generation: `updated_at` stored as integer microseconds (`_micros`).
        self._micros_layouts: dict[str, bool] = {}

    def search(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        limit: int,
    ) -> list[Candidate]:
        query_vector = check_query_vector(vector)
        engine_filter = edge_filter(filter)
        if limit <= 0 or filter.matches_nothing():
            return []
        flat = self._flat(generation_id, query_vector)
        if flat is not None:
            with engine_call(FLAT_ENGINE):
                found = flat.search(_same(vector, query_vector), filter, limit)
            if found is not None:
                return found
        shard = self._shard(generation_id)
        ids = self._ids(generation_id)
        uuid_only = ids is not None and not ids.integer
        micros = _timed(filter) and self._micros(generation_id, shard)
        if micros or (filter.document_ids is not None and not uuid_only):
            engine_filter = edge_filter(filter, micros=micros, ids=ANY_IDS if ids is None else ids)
        listed = (
            None if uuid_only or filter.document_ids is None else frozenset(filter.document_ids)
        )
        while True:
            found = self._search(shard, generation_id, query_vector, engine_filter, limit)
            if listed is None:
                return found
            # An integer point of a document not listed: an absent listed document's
            # integer id that another document's point holds (that point's id is its own
            # document's integer id). Left out, and the search done again without it.
            strays = [c.document_id for c in found if c.document_id not in listed]
            if not strays:
                return found
            assert engine_filter is not None  # `edge_filter` never answers None
            hash = int_point_id if ids is None else ids.hash
            engine_filter = Filter(
                must=engine_filter.must,
                must_not=[
                    *(engine_filter.must_not or ()),
                    HasIdCondition({hash(d) for d in strays}),
                ],
            )

    def _search(
        self,
        shard: EdgeShard,
        generation_id: str,
        query_vector: list[float],
        engine_filter: Filter | None,
        limit: int,
    ) -> list[Candidate]:
        table = self._points(generation_id)
        stamp = None if table is None else table.stamp()
        if table is not None and stamp is not None:
            points = self._top(shard, generation_id, query_vector, engine_filter, limit, False)
            found = table.hits(points, stamp)
            if found is not None:
                return best_first(found, limit)
        points = self._top(shard, generation_id, query_vector, engine_filter, limit)
        return best_first(
            (candidate_of(with_id(p.payload or {}, p.id), p.score) for p in points), limit
        )

    def scores(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        *,
        revisions: Mapping[str, int] | None = None,
        tenant: str = "",
    ) -> dict[str, float]:
        """`VectorSearch.scores`.

        Without `revisions`: one exact request (`SearchParams(exact=True)`) over the
        listed documents' points, without payloads. A point's id is a pure function of
        its document's id (`contracts.vector_payload.point_id`), so the ids are matched
        as point ids (`HasIdCondition`: the engine goes to those points directly; a
        `MatchAny` on the `document_id` payload index cost half as much again) and each
        returned point maps back to its document by that id.

        With `revisions` (the revision the caller found each document at, through this
        same `filter`) and a memo: a document whose stored unit vector at the revision
        named is known is scored from it here (equal to the engine's score to float32
        rounding, ~1e-7, not bit for bit), the same whether the memo held it or the
        engine's exact lookup just brought it along (and it was memoized); a point at
        another revision gets the engine's score, as without `revisions`. Only for a
        generation whose vectors all fit the memo when first asked (`_memoized`); a
        larger one is looked up by the engine, as without `revisions`: refilling a
        churning memo would cost more than the lookups it saves. The memo's entries are
        `tenant`'s (its own bound: another tenant's lookups never evict them)."""
        query_vector = check_query_vector(vector)
        must = _must(filter, with_ids=False)
        size = id_lookup_size(filter, DEPENDENCY)
        if size == 0 or filter.matches_nothing():
            return {}
        flat = self._flat(generation_id, query_vector)
        if flat is not None:
            with engine_call(FLAT_ENGINE):
                scored = flat.scores(_same(vector, query_vector), filter)
            if scored is not None:
                return scored
        listed = list(filter.document_ids or ())
        shard = self._shard(generation_id)
        if _timed(filter) and self._micros(generation_id, shard):
            must = _must(filter, with_ids=False, micros=True)
        memo = self._memo
        if revisions is None or memo is None or not self._memoized(shard, generation_id, vector):
            return self._exact_scores(shard, generation_id, query_vector, must, listed)
        held, block, missing = memo.get_many(tenant, generation_id, listed, revisions)
        out: dict[str, float] = {}
        read: list[npt.NDArray[np.float32]] = []
        if missing:
            out = self._read(
                shard, generation_id, query_vector, must, missing, revisions, held, read, tenant
            )
        if held:
            query = _unit(query_vector)
            if read:
                block = np.stack(read) if block is None else np.concatenate([block, np.stack(read)])
            assert block is not None
            if block.shape[1] != query.shape[0]:
                # The engine refuses it with its own message (`EMBEDDER_MISMATCH`).
                return self._exact_scores(shard, generation_id, query_vector, must, listed)
            # Each row summed on its own (pairwise, in float64): a document's score never
            # depends on which others are scored with it, so pages of one query agree.
            rows = block.astype(np.float64)
            np.multiply(rows, query, out=rows)  # the same products, without a second array
            # Clamped as `cosine_score` clamps (the sums are finite: no NaN to differ on).
            cosines = np.clip(rows.sum(axis=1), -1.0, 1.0).tolist()
            out.update(zip(held, cosines, strict=True))
        return out

    def _read(
        self,
        shard: EdgeShard,
        generation_id: str,
        query_vector: list[float],
        must: list[ConditionType],
        listed: list[str],
        revisions: Mapping[str, int],
        held: list[str],
        read: list[npt.NDArray[np.float32]],
        tenant: str,
    ) -> dict[str, float]:
        """The engine's exact lookup of `listed`, vectors included: a point at the
        revision named joins `held` (its vector appended to `read`, scored like the
        memo's) and is memoized (as `tenant`'s); the score of a point at another
        revision is the engine's, returned."""
        assert self._memo is not None
        memo = self._memo
        ids = self._ids(generation_id)
        point_ids = _listed_ids(ids, listed)
        # A UUID point's document: by the point id's `int` (`_point_number`); an integer
        # point's: read from the table or payload, and kept only if it is listed.
        documents = {_point_number(document_id): document_id for document_id in listed}
        wanted = None if ids is not None and not ids.integer else frozenset(listed)
        engine_filter = Filter(
            must=[*must, HasIdCondition(point_ids)],
            must_not=[_HIDDEN],
        )
        # The points' revisions from the generation's point table when it has one (a
        # payload read of random points costs ~4x the lookup itself: payloads are on
        # disk), from their payloads when it has none or a write came in between.
        table = self._points(generation_id)
        stamp = None if table is None else table.stamp()
        found: list[Any] | None = None
        points: list[ScoredPoint] = []
        # `ScoredPoint.id` makes a new `uuid.UUID` on every read: read once per point.
        pids: list[PointId] = []
        if table is not None and stamp is not None:
            points = self._exact(
                shard,
                generation_id,
                query_vector,
                engine_filter,
                len(point_ids),
                with_vectors=True,
            )
            pids = [p.id for p in points]
            integer = table.integer_ids
            found = table.fields([_table_key(pid, integer) for pid in pids], stamp)
        if found is None:
            points = self._exact(
                shard,
                generation_id,
                query_vector,
                engine_filter,
                len(point_ids),
                with_vectors=True,
                payload=_REVISION_ONLY if wanted is None else _REVISION_AND_DOCUMENT,
            )
            pids = [p.id for p in points]
            found = [
                ((p.payload or {}).get(DOCUMENT_ID), (p.payload or {}).get(REVISION))
                for p in points
            ]
        other: dict[str, float] = {}
        fills: list[tuple[str, int, npt.NDArray[np.float32]]] = []
        for point, pid, fields in zip(points, pids, found, strict=True):
            if type(pid) is int:
                document_id = fields[0]
                if wanted is None or document_id not in wanted:
                    continue
            else:
                document_id = documents[_key(pid)]
            named = point.vector
            dense = named.get(VECTOR_NAME) if isinstance(named, dict) else None
            revision = fields[1]
            if isinstance(dense, list) and revision == revisions.get(document_id):
                stored = _as_vector(dense)
                held.append(document_id)
                read.append(stored)
                if isinstance(revision, int):
                    fills.append((document_id, revision, stored))
            else:
                other[document_id] = cosine_score(point.score)
        if fills:
            memo.put_many(tenant, generation_id, fills)
        return other

    def _memoized(self, shard: EdgeShard, generation_id: str, vector: Sequence[float]) -> bool:
        """Whether the memo serves `generation_id`: decided once per generation and
        process (so one query's pages are always scored one way), by whether its points'
        vectors fit the memo's bound (a tenant's: a generation belongs to one tenant)."""
        decided = self._memo_serves.get(generation_id)
        if decided is None:
            assert self._memo is not None
            try:
                points = shard.info().points_count
            except Exception as error:  # the driver raises bare Exception
                raise _translate(error, generation_id) from error
            decided = points * (64 + 4 * len(vector)) <= self._memo.max_bytes
            self._memo_serves[generation_id] = decided
        return decided

    def _exact_scores(
        self,
        shard: EdgeShard,
        generation_id: str,
        query_vector: list[float],
        must: list[ConditionType],
        listed: Sequence[str],
    ) -> dict[str, float]:
        """The engine's exact lookup of `listed` under `must` (the filter's clauses
        without its ids)."""
        ids = self._ids(generation_id)
        point_ids = _listed_ids(ids, listed)
        # Point id (as `uuid.UUID.int`) -> document id: a document id that is a canonical
        # UUID is its own point id (`point_id`), so no UUID object is built for it, and
        # each returned point's id is read as a number (its string cost ~1.4 µs more).
        documents = {_point_number(document_id): document_id for document_id in listed}
        engine_filter = Filter(must=[*must, HasIdCondition(point_ids)], must_not=[_HIDDEN])
        if ids is not None and not ids.integer:
            points = self._exact(shard, generation_id, query_vector, engine_filter, len(listed))
            return {documents[_key(point.id)]: cosine_score(point.score) for point in points}
        # Integer points: their documents from the point table (or, without one or after
        # a write in between, their payloads), a document not listed left out.
        wanted = frozenset(listed)
        table = self._points(generation_id)
        stamp = None if table is None else table.stamp()
        if table is not None and stamp is not None:
            points = self._exact(shard, generation_id, query_vector, engine_filter, len(point_ids))
            out: dict[str, float] = {}
            get = table.get
            for point in points:
                pid = point.id
                if type(pid) is int:
                    fields = get(pid) if table.integer_ids else None
                    if fields is None or fields[0] not in wanted:
                        continue
                    document_id = fields[0]
                else:
                    document_id = documents[_key(pid)]
                out[document_id] = cosine_score(point.score)
            if table.stamp() == stamp:
                return out
        points = self._exact(
            shard,
            generation_id,
            query_vector,
            engine_filter,
            len(point_ids),
            payload=_DOCUMENT_ONLY,
        )
        out = {}
        for point in points:
            pid = point.id
            if type(pid) is int:
                owner = (point.payload or {}).get(DOCUMENT_ID)
                if owner not in wanted:
                    continue
                document_id = str(owner)
            else:
                document_id = documents[_key(pid)]
            out[document_id] = cosine_score(point.score)
        return out

    def _exact(
        self,
        shard: EdgeShard,
        generation_id: str,
        vector: list[float],
        engine_filter: Filter | None,
        limit: int,
        *,
        with_vectors: bool = False,
        payload: PayloadSelector | bool = False,
    ) -> list[ScoredPoint]:
        """The engine's exact search; with the vectors when `with_vectors`, the
        `payload` selected."""
        request = QueryRequest(
            limit=limit,
            query=Query.Nearest(vector, using=VECTOR_NAME),
            filter=engine_filter,
            with_payload=payload,
            with_vector=with_vectors,
            params=SearchParams(exact=True),
        )
        try:
            with engine_call(ENGINE):
                return shard.query(request)
        except Exception as error:  # the driver raises bare Exception
            raise _translate(error, generation_id) from error

    def _flat(self, generation_id: str, vector: Sequence[float]) -> FlatVectors | None:
        """The generation's in-memory copy to scan, if it has one of `vector`'s
        dimension (a query of another dimension goes to the engine, which refuses it)."""
        if self._flat_provider is None:
            return None
        flat = _provided(self._flat_provider, generation_id)
        return flat if flat is not None and flat.dimension == len(vector) else None

    def _ids(self, generation_id: str) -> PointIds | None:
        """How the generation maps document ids to point ids; None without a provider
        (then listed documents are looked up at both ids)."""
        if self._ids_provider is None:
            return None
        return _provided(self._ids_provider, generation_id)

    def _points(self, generation_id: str) -> PointTable | None:
        if self._points_provider is None:
            return None
        return _provided(self._points_provider, generation_id)

    def _shard(self, generation_id: str) -> EdgeShard:
        try:
            return self._shard_provider(generation_id)
        except KeyError:
            raise _unknown(generation_id) from None

    def _micros(self, generation_id: str, shard: EdgeShard) -> bool:
        """Whether the generation stores `updated_at` as integer microseconds (an integer
        index on it: qdrant-edge generations created since session 26); fixed when the
        generation is created, so asked of the engine once."""
        micros = self._micros_layouts.get(generation_id)
        if micros is None:
            try:
                schema = shard.info().payload_schema.get(UPDATED_AT)
            except Exception as error:  # the driver raises bare Exception
                raise _translate(error, generation_id) from error
            micros = schema is not None and schema.data_type == PayloadSchemaType.Integer
            self._micros_layouts[generation_id] = micros
        return micros

    def _top(
        self,
        shard: EdgeShard,
        generation_id: str,
        vector: list[float],
        engine_filter: Filter | None,
        limit: int,
        with_payload: bool = True,
    ) -> list[ScoredPoint]:
        """The best points, including every point tied with the `limit`-th one; with
        the candidate fields as payload, or (`with_payload` False) ids and scores only.

        The engine orders ties arbitrarily, so one extra point is fetched: if it ties
        with the last one kept, the tie group may continue and the fetch doubles.

        A filtered HNSW search can stop short: the graph search skips points the filter
        refuses and may find fewer than `limit` of those it accepts although more match
        (seen once in a loaded test run: 1 hit of 10 after an optimize). Whenever fewer
        than `limit` points come back, the engine counts the filter's matches and, if
        there are more, the search is done again exactly (a brute-force scan of them).
        """
        fetch = limit + 1
        exact = False
        while True:
            request = QueryRequest(
                limit=fetch,
                query=Query.Nearest(vector, using=VECTOR_NAME),
                filter=engine_filter,
                with_payload=_RETURNED if with_payload else False,
                with_vector=False,
                params=(_EXACT if exact else SearchParams(hnsw_ef=max(self._hnsw_ef, fetch))),
            )
            try:
                with engine_call(ENGINE):
                    points = shard.query(request)
                    if len(points) < limit and not exact:
                        count = shard.count(CountRequest(exact=True, filter=engine_filter))
                        if count > len(points):
                            exact = True
                            continue
            except Exception as error:  # the driver raises bare Exception
                raise _translate(error, generation_id) from error
            if len(points) < fetch or points[-1].score != points[limit - 1].score:
                return points
            fetch *= 2


def edge_filter(
    filter: SearchFilter, *, micros: bool = False, ids: PointIds | None = None
) -> Filter | None:
    """The engine filter equivalent to `filter`, less the documents hidden from the
    vector lane (never None: that exclusion always applies).

    Every clause is a `must`; any-of lists are `MatchAny` on keyword indexes, facets are
    matched as `"name=value"` strings, time bounds are inclusive datetime ranges in UTC
    (naive bounds are `INVALID_REQUEST`), listed documents are their point ids
    (`HasIdCondition`: a point's id is a function of its document's id, and generations
    created since session 25 have no `document_id` payload index).
    Phrase groups are refused (`INTERNAL`): the query worker resolves them to ids.
    With `micros`, for a generation storing `updated_at` as integer microseconds
    (`_micros_range`). Listed documents at the point ids `ids` gives (`_listed_ids`; by
    default UUID ids, as generations before session 27; `ANY_IDS`: at both ids).
    """
    must = _must(filter, micros=micros, ids=ids)
    return Filter(must=must or None, must_not=[_HIDDEN])


def _must(
    filter: SearchFilter,
    *,
    with_ids: bool = True,
    micros: bool = False,
    ids: PointIds | None = None,
) -> list[ConditionType]:
    """The `must` clauses of `edge_filter` (the same refusals); without `with_ids`, less
    the `document_ids` clause."""
    if filter.phrases:
        raise OrreryError(
            ErrorCode.INTERNAL,
            "vector search cannot apply phrase filters; resolve them to document_ids first",
            {"engine": "qdrant-edge"},
        )
    must: list[ConditionType] = []
    if filter.galaxy is not None:
        must.append(FieldCondition(GALAXY, match=MatchValue(filter.galaxy)))
    if filter.status is not None:
        must.append(FieldCondition(STATUS, match=MatchAny(list(filter.status))))
    if filter.visibility is not None:
        must.append(FieldCondition(VISIBILITY, match=MatchAny(list(filter.visibility))))
    if micros and _timed(filter):
        must.append(_micros_range(filter.updated_after, filter.updated_before))
    elif _timed(filter):
        must.append(
            FieldCondition(
                UPDATED_AT,
                range=RangeDateTime(
                    gte=_bound(filter.updated_after), lte=_bound(filter.updated_before)
                ),
            )
        )
    for name, values in sorted(filter.facets.items()):
        must.append(FieldCondition(FACETS, match=MatchAny(facet_terms(name, values))))
    if filter.document_ids is not None and with_ids:
        must.append(
            HasIdCondition(_listed_ids(_UUID_IDS if ids is None else ids, filter.document_ids))
        )
    if filter.rings is not None:
        must.append(FieldCondition(RING, match=MatchAny(list(filter.rings))))
    if filter.ring_trees is not None:
        must.append(FieldCondition(RING_PATH, match=MatchAny(list(filter.ring_trees))))
    return must


_EXACT = SearchParams(exact=True)

# Documents hidden from the vector lane (`Record.index_lanes`) are never a hit.
_HIDDEN = FieldCondition(FACETS, match=MatchValue(hidden_term("vector")))


# Memoized: the weighted re-score maps every candidate's id on each query, and a uuid5 in
# Python costs ~15 µs (a quarter of `scores` at 70 ids); the same documents recur across
# queries. `lru_cache` is C, thread-safe and bounded.
@functools.lru_cache(maxsize=65_536)
def _point_key(document_id: str) -> str:
    """`str(point_id(document_id))`, without parsing a canonical UUID into an object."""
    # A canonical UUID string is its own point id (`point_id` takes it as is).
    if is_canonical_uuid(document_id):
        return document_id
    return str(point_id(document_id))


@functools.lru_cache(maxsize=65_536)
def _point_number(document_id: str) -> int:
    """`point_id(document_id).int`, as `_point_key` spells it (see there)."""
    return int(_point_key(document_id).replace("-", ""), 16)


# Listed documents of a generation whose scheme is unknown (no ids provider): at both
# point ids.
ANY_IDS = PointIds(True, hash=int_point_id)
_UUID_IDS = PointIds(False)


@functools.lru_cache(maxsize=65_536)
def _int_key(document_id: str) -> int:
    """`int_point_id`, memoized as `_point_key` is."""
    return int_point_id(document_id)


def _listed_ids(ids: PointIds | None, documents: Iterable[str]) -> set[PointId]:
    """The point ids listed `documents` are at: `_point_key` (UUID ids), the integer id
    of each but the fallback ones (integer ids), both for each (`ids` None or `ANY_IDS`:
    the scheme unknown)."""
    if ids is None or ids is ANY_IDS:
        out: set[PointId] = set()
        for document_id in documents:
            out.add(_point_key(document_id))
            out.add(_int_key(document_id))
        return out
    if not ids.integer:
        return {_point_key(document_id) for document_id in documents}
    fallback = ids.fallback
    hash = _int_key if ids.hash is int_point_id else ids.hash
    return {_point_key(d) if d in fallback else hash(d) for d in documents}


def _table_key(pid: PointId, integer: bool) -> object:
    """A point's key in a point table (`contracts.point_ids.table_key`)."""
    if integer or type(pid) is int:
        return pid
    return _key(pid)


def _key(pid: PointId) -> int:
    """A point's key in a point table: `uuid.UUID.int` (every point this project writes
    has a UUID id; any other id is no key, so the table's answer is None)."""
    return pid.int if isinstance(pid, uuid.UUID) else -1


def _same(given: Sequence[float], checked: list[float]) -> Sequence[float]:
    """What to hand a flat copy: the caller's tuple itself when it gave one (a flat copy
    knows the last tuple it scaled by identity), else the checked values."""
    return given if isinstance(given, tuple) else checked


def _timed(filter: SearchFilter) -> bool:
    return filter.updated_after is not None or filter.updated_before is not None


# Integers up to this magnitude are exact as float64 (microseconds: years ~1685-2255).
_EXACT_FLOAT = 1 << 53


def _micros_range(after: datetime | None, before: datetime | None) -> ConditionType:
    """`after <= updated_at <= before` (inclusive, either side open) on integer
    microseconds, exactly as the datetime range matches the text form.

    The binding's only numeric range is `RangeFloat`; the engine turns its bounds into
    integers for an integer index (`f as i64`), exact for every bound a float64 holds.
    A bound beyond 2**53 us from the epoch that no float64 holds is narrowed to the
    nearest float64 inside the range, and the integers between the two are matched as
    values (fewer than 32 per side for any `datetime`)."""
    low = None if after is None else utc_micros(after)
    high = None if before is None else utc_micros(before)
    if low is not None and high is not None and low > high:
        return FieldCondition(UPDATED_AT, range=RangeFloat(gte=1.0, lte=0.0))  # nothing
    inner_low = None if low is None else _float_at_least(low)
    inner_high = None if high is None else _float_at_most(high)
    edges: list[int] = []
    if low is not None and inner_low is not None and int(inner_low) != low:
        edges.extend(range(low, int(inner_low)))
    if high is not None and inner_high is not None and int(inner_high) != high:
        edges.extend(range(int(inner_high) + 1, high + 1))
    if inner_low is not None and inner_high is not None and inner_low > inner_high:
        # No float64 inside the range: it holds fewer integers than one float step.
        assert low is not None and high is not None
        return FieldCondition(UPDATED_AT, match=MatchAny(list(range(low, high + 1))))
    inner = FieldCondition(UPDATED_AT, range=RangeFloat(gte=inner_low, lte=inner_high))
    if not edges:
        return inner
    return Filter(should=[inner, FieldCondition(UPDATED_AT, match=MatchAny(sorted(set(edges))))])


def _float_at_least(value: int) -> float:
    """The least float64 >= `value`."""
    near = float(value)
    if abs(value) <= _EXACT_FLOAT or int(near) >= value:
        return near
    return math.nextafter(near, math.inf)


def _float_at_most(value: int) -> float:
    """The greatest float64 <= `value`."""
    near = float(value)
    if abs(value) <= _EXACT_FLOAT or int(near) <= value:
        return near
    return math.nextafter(near, -math.inf)


def _bound(value: datetime | None) -> str | None:
    return None if value is None else utc_timestamp(value)


def _provided(provider: Callable[[str], _T], generation_id: str) -> _T:
    """What a per-generation provider (the in-memory copy, the point table) gives for
    `generation_id`: an unknown generation is `_unknown`, an engine failure (bare
    `Exception` from the binding) is translated, Orrery's own errors pass through."""
    try:
        return provider(generation_id)
    except KeyError:
        raise _unknown(generation_id) from None
    except OrreryError:
        raise
    except Exception as error:  # the engine's read failed: bare Exception
        raise _translate(error, generation_id) from error


def _unknown(generation_id: str) -> OrreryError:
    return OrreryError(
        ErrorCode.COVERAGE_UNAVAILABLE,
        f"no vector index for generation {generation_id!r}",
        {"generation_id": generation_id},
    )


def _translate(error: Exception, generation_id: str) -> OrreryError:
    message = str(error)
    if "dimension error" in message:
        return OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"query vector does not fit generation {generation_id!r}: {message}",
            {"generation_id": generation_id},
        )
    if "not initialized" in message:
        # The shard was closed under us: the generation was dropped or the index closed.
        return OrreryError(
            ErrorCode.COVERAGE_UNAVAILABLE,
            f"vector index of generation {generation_id!r} was closed",
            {"generation_id": generation_id},
        )
    return DependencyUnavailable(DEPENDENCY, f"query {generation_id}: {message}")
