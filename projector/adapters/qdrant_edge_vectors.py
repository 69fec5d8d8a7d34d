"""qdrant-edge (embedded Qdrant) as the projector's vector index: one shard per generation.

Layout: `root / generation_id` is one `EdgeShard` directory holding one named dense vector
("dense", cosine) and the payload the query side filters on. qdrant-edge allows one
process per shard directory (a second `EdgeShard.load` fails on the WAL lock), so the
query side searches through `QdrantEdgeVectorIndex.shard_for` of this same object.

Payload of a point (the contract with `query.adapters.qdrant_edge_vectors`):

| field         | value                                   | payload index            |
|---------------|-----------------------------------------|--------------------------|
| `document_id` | the document id                         | keyword                  |
| `revision`    | int                                     | integer                  |
| `item_id`     | str                                     | -                        |
| `galaxy`      | str                                     | keyword (tenant)         |
| `ring`        | str                                     | -                        |
| `status`      | str                                     | keyword                  |
| `visibility`  | list of labels                          | keyword                  |
| `facets`      | list of `"name=value"` strings          | keyword                  |
| `updated_at`  | RFC 3339 UTC with microseconds (`…Z`)   | datetime                 |

`updated_at` is indexed as a datetime: Qdrant keeps datetimes as integer microseconds
since the epoch, the resolution of Python's `datetime`, so inclusive range bounds are
exact (a float epoch would round at microsecond scale).

HNSW: qdrant-edge builds graphs only in `optimize()`, and only for segments above the
indexing threshold (10 MB of vectors by default, ~6.5k vectors at 384-d). Until then a
segment is searched by brute force, which qdrant-edge picks on its own, so search stays
exact (the same results as `SearchParams(exact=True)`).

**`EdgeShard.optimize()` holds the GIL for its whole run** (qdrant-edge-py 0.9: 4.5-6.5 s
at 10k 384-d vectors, 13 s at 20k, 100+ s at 100k): in-process, every Python thread of
the process stops meanwhile - searches, `apply`, an HTTP server. The engine itself would
serve queries and updates concurrently. Hence two ways to optimize:
- in-process (`optimize_if_needed`, `start_background_optimizer`): for a process that
  serves nothing else, or when a pause of that length is acceptable;
- `in_subprocess=True`: the shard is closed here, a child process loads, optimizes and
  closes it, then it is reopened. This process keeps running; only that generation is
  unavailable meanwhile (searches: `COVERAGE_UNAVAILABLE`, `apply`:
  `DependencyUnavailable`, both retryable). Meant for a generation before it goes live.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeVectorParams,
    HnswIndexConfig,
    KeywordIndexParams,
    PayloadSchemaType,
    Point,
    ScrollRequest,
    UpdateOperation,
)

from contracts.digests import id_set_digest
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import IndexDocument
from projector.ports import IndexEvidence

if TYPE_CHECKING:
    from qdrant_edge import NamedVector, PayloadSchemaParams, PointId

__all__ = [
    "VECTOR_NAME",
    "QdrantEdgeTuning",
    "QdrantEdgeVectorIndex",
    "payload_of",
    "point_id",
    "utc_timestamp",
]

_log = logging.getLogger(__name__)

DEPENDENCY = "qdrant-edge"
VECTOR_NAME = "dense"
# Fixed forever: it maps non-UUID document ids to point ids, so changing it re-keys every
# shard built before the change.
_POINT_ID_NAMESPACE = uuid.UUID("5b0f2a71-3c4e-4d38-9f0e-6a1d2c7e8b90")
_GENERATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_CONFIG_FILE = "edge_config.json"
_SCROLL_PAGE = 1_000
# Run by `optimize(in_subprocess=True)` with the shard path as argv[1]; prints whether
# segments changed.
_OPTIMIZE_SCRIPT = """
import sys
from qdrant_edge import EdgeShard
shard = EdgeShard.load(sys.argv[1])
changed = shard.optimize()
shard.flush()
shard.close()
print(changed)
"""

_PAYLOAD_INDEXES: dict[str, PayloadSchemaType | PayloadSchemaParams] = {
    "galaxy": KeywordIndexParams(is_tenant=True),
    "status": PayloadSchemaType.Keyword,
    "visibility": PayloadSchemaType.Keyword,
    "facets": PayloadSchemaType.Keyword,
    "document_id": PayloadSchemaType.Keyword,
    "updated_at": PayloadSchemaType.Datetime,
    "revision": PayloadSchemaType.Integer,
}


@dataclass(frozen=True)
class QdrantEdgeTuning:
    """Engine knobs fixed when a generation's shard is created (defaults are Qdrant's).

    `indexing_threshold_kb`: segments with fewer KB of vectors stay unindexed (exact).
    `full_scan_threshold_kb`: an HNSW segment this small is still searched by brute force.
    `max_search_threads`: size of the shard's search pool; `None` derives it from the CPUs.
    """

    hnsw_m: int = 16
    hnsw_ef_construct: int = 100
    full_scan_threshold_kb: int = 10_000
    indexing_threshold_kb: int = 10_000
    max_search_threads: int | None = None

    def edge_config(self, dimension: int) -> EdgeConfig:
        return EdgeConfig(
            vectors={VECTOR_NAME: EdgeVectorParams(size=dimension, distance=Distance.Cosine)},
            hnsw_config=HnswIndexConfig(
                m=self.hnsw_m,
                ef_construct=self.hnsw_ef_construct,
                full_scan_threshold=self.full_scan_threshold_kb,
            ),
            optimizers=EdgeOptimizersConfig(indexing_threshold=self.indexing_threshold_kb),
            max_search_threads=self.max_search_threads,
        )


def point_id(document_id: str) -> uuid.UUID:
    """The point id of a document: its UUID if it is a canonical UUID string, else uuid5.

    Only the canonical lowercase form is taken as is, so that two distinct strings (say
    upper- and lowercase spellings) can never share a point.
    """
    try:
        parsed = uuid.UUID(document_id)
    except ValueError:
        return uuid.uuid5(_POINT_ID_NAMESPACE, document_id)
    if str(parsed) == document_id:
        return parsed
    return uuid.uuid5(_POINT_ID_NAMESPACE, document_id)


def utc_timestamp(value: datetime) -> str:
    """RFC 3339 in UTC with microseconds, the form `updated_at` is stored and compared in."""
    if value.tzinfo is None:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "timestamps must carry a timezone",
            {"value": value.isoformat()},
        )
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def payload_of(document: IndexDocument) -> dict[str, Any]:
    """The payload stored with a document's point (see the module docstring)."""
    return {
        "document_id": document.document_id,
        "revision": document.revision,
        "item_id": document.item_id,
        "galaxy": document.galaxy,
        "ring": document.ring,
        "status": document.status,
        "updated_at": utc_timestamp(document.updated_at),
        "visibility": list(document.visibility),
        "facets": sorted(
            f"{name}={value}" for name, values in document.facets.items() for value in values
        ),
    }


@dataclass
class _Generation:
    shard: EdgeShard
    dimension: int | None
    indexing_threshold_kb: int
    # `apply` reads present revisions and then writes: one writer at a time per shard.
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    # One optimize at a time per shard; `drop` and `close` wait for a running one.
    optimize_lock: threading.Lock = field(default_factory=threading.Lock)


class QdrantEdgeVectorIndex:
    """Vector indexes in qdrant-edge shards under `root`, one directory per generation.

    Guarantees (those of `projector.ports.VectorIndex`):
    - `apply` is visible to searches through `shard_for` when it returns. Upserts and
      deletes are two engine operations; a crash between them leaves the upserts only,
      and re-applying the same call converges (every step is idempotent).
    - An upsert never replaces a newer revision already present; a delete at revision r
      removes the document only if its present revision is <= r. Within one call a
      document's upserts are resolved first (highest revision wins), then its deletes.
    - Every upserted vector has the generation's dimension, is finite and non-zero;
      anything else rejects the whole call with `EMBEDDER_MISMATCH` before any write.
    - `evidence` is read back from a full scroll of the shard.
    - Generations created by an earlier process are opened lazily on first use.
    - HNSW is built by `optimize` / `optimize_if_needed` / `start_background_optimizer`;
      until then (and for points written since) search is exact brute force.

    Thread-safe. Driver failures surface as `DependencyUnavailable`; an unknown
    generation is `NOT_FOUND` (`shard_for` raises `KeyError` instead); a generation
    being optimized in a child process is `DependencyUnavailable` (retryable).
    """

    def __init__(self, root: Path | str, *, tuning: QdrantEdgeTuning | None = None) -> None:
        self._root = Path(root)
        self._tuning = tuning or QdrantEdgeTuning()
        self._lock = threading.RLock()
        self._generations: dict[str, _Generation] = {}
        # Generations handed to an optimizer child process; closed here meanwhile.
        self._away: set[str] = set()
        # Unindexed count at which optimize last changed nothing: retried only above it.
        self._idle_at: dict[str, int] = {}
        self._closed = False
        self._stop = threading.Event()
        self._optimizer: threading.Thread | None = None

    # -- VectorIndex -----------------------------------------------------------------

    def create(self, generation_id: str, dimension: int) -> None:
        """Create the generation's shard (no-op if it exists with the same dimension)."""
        if dimension <= 0:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST, "dimension must be positive", {"dimension": dimension}
            )
        with self._lock:
            generation = self._open(generation_id)
            if generation is None:
                path = self._path(generation_id)
                if path.exists():
                    # A directory without a shard config is the rest of an interrupted
                    # create: nothing in it is a shard yet.
                    shutil.rmtree(path)
                self._root.mkdir(parents=True, exist_ok=True)
                with _translated(f"create {generation_id}"):
                    shard = EdgeShard.create(str(path), self._tuning.edge_config(dimension))
                generation = _Generation(
                    shard=shard,
                    dimension=dimension,
                    indexing_threshold_kb=self._tuning.indexing_threshold_kb,
                )
                self._generations[generation_id] = generation
            elif generation.dimension is None:
                generation.dimension = dimension
            elif generation.dimension != dimension:
                raise OrreryError(
                    ErrorCode.EMBEDDER_MISMATCH,
                    f"generation {generation_id!r} holds {generation.dimension}-d vectors",
                    {"expected": generation.dimension, "got": dimension},
                )
            self._ensure_payload_indexes(generation)

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None:
        """Write upserts, then deletes; stale ones (older than present) are skipped."""
        generation = self._require(generation_id)
        for document in upserts:
            _check_vector(document, generation.dimension)
        newest: dict[uuid.UUID, IndexDocument] = {}
        for document in upserts:
            pid = point_id(document.document_id)
            kept = newest.get(pid)
            if kept is None or kept.revision <= document.revision:
                newest[pid] = document
        delete_at: dict[uuid.UUID, int] = {}
        for document_id, revision in deletes:
            pid = point_id(document_id)
            delete_at[pid] = max(revision, delete_at.get(pid, revision))
        if not newest and not delete_at:
            return
        with generation.write_lock, _translated(f"apply to {generation_id}"):
            present = self._present_revisions(generation.shard, [*newest, *delete_at])
            writes: dict[uuid.UUID, IndexDocument] = {}
            revision_after = dict(present)
            for pid, document in newest.items():
                current = present.get(pid)
                if current is None or current <= document.revision:
                    writes[pid] = document
                    revision_after[pid] = document.revision
            removals: list[PointId] = []
            for pid, revision in delete_at.items():
                current = revision_after.get(pid)
                if current is not None and current <= revision:
                    writes.pop(pid, None)
                    if pid in present:
                        removals.append(pid)
            if writes:
                points = [
                    Point(pid, _named_vector(document), payload_of(document))
                    for pid, document in writes.items()
                ]
                generation.shard.update(UpdateOperation.upsert_points(points))
            if removals:
                generation.shard.update(UpdateOperation.delete_points(removals))

    def evidence(self, generation_id: str) -> IndexEvidence:
        """Count and `id_set_digest` of the `(document_id, revision)` pairs the shard holds."""
        generation = self._require(generation_id)
        pairs = list(self._scroll_pairs(generation.shard, generation_id))
        return IndexEvidence(document_count=len(pairs), id_set_digest=id_set_digest(pairs))

    def drop(self, generation_id: str) -> None:
        """Close and delete the generation's shard (no-op if absent); waits for its optimize."""
        _check_generation_id(generation_id)
        with self._lock:
            self._raise_if_away(generation_id)
            self._idle_at.pop(generation_id, None)
            generation = self._generations.pop(generation_id, None)
            if generation is not None:
                self._close_generation(generation_id, generation)
            path = self._path(generation_id)
            if path.exists():
                shutil.rmtree(path)

    def close(self) -> None:
        """Stop the optimizer, flush and close every open shard. Idempotent."""
        self._stop.set()
        optimizer = self._optimizer
        if optimizer is not None and optimizer is not threading.current_thread():
            optimizer.join()
        with self._lock:
            self._closed = True
            generations, self._generations = self._generations, {}
            for generation_id, generation in generations.items():
                self._close_generation(generation_id, generation)

    # -- query side and maintenance ----------------------------------------------------

    def shard_for(self, generation_id: str) -> EdgeShard:
        """The open shard of `generation_id`, for the query side in this process.

        Raises `KeyError` if the generation does not exist, `DependencyUnavailable` while
        a child process optimizes it. Callers fetch the shard per request: the object
        changes when the generation is reopened.
        """
        generation = self._get(generation_id)
        if generation is None:
            raise KeyError(generation_id)
        return generation.shard

    def unindexed_count(self, generation_id: str) -> int:
        """Points of the generation not yet covered by an HNSW graph."""
        generation = self._require(generation_id)
        with _translated(f"info of {generation_id}"):
            info = generation.shard.info()
            return max(0, info.points_count - info.indexed_vectors_count)

    def optimize_needed(self, generation_id: str, *, min_unindexed: int = 1_000) -> bool:
        """Whether `optimize` would build HNSW for at least `min_unindexed` points.

        True when that many points lack HNSW, they hold more vectors than the shard's
        indexing threshold (below it qdrant-edge leaves them unindexed anyway), and the
        last optimize that changed nothing saw fewer.
        """
        generation = self._require(generation_id)
        unindexed = self.unindexed_count(generation_id)
        vector_kb = unindexed * (generation.dimension or 1) * 4 / 1024
        return (
            unindexed >= max(1, min_unindexed)
            and vector_kb >= generation.indexing_threshold_kb
            and unindexed > self._idle_at.get(generation_id, -1)
        )

    def optimize(self, generation_id: str, *, in_subprocess: bool = False) -> bool:
        """Merge segments and build HNSW now; returns whether segments changed.

        Blocks until done. In-process it holds the GIL throughout (see the module
        docstring); with `in_subprocess` the generation is unavailable instead. Returns
        False without waiting if another optimize of the generation is running.
        """
        if in_subprocess:
            changed = self._optimize_in_subprocess(generation_id)
        else:
            generation = self._require(generation_id)
            if not generation.optimize_lock.acquire(blocking=False):
                return False
            try:
                if self._generations.get(generation_id) is not generation:
                    return False  # dropped or closed meanwhile
                with _translated(f"optimize {generation_id}"):
                    changed = generation.shard.optimize()
            finally:
                generation.optimize_lock.release()
        if changed:
            self._idle_at.pop(generation_id, None)
        else:
            self._idle_at[generation_id] = self.unindexed_count(generation_id)
        return changed

    def optimize_if_needed(
        self,
        generation_id: str,
        *,
        min_unindexed: int = 1_000,
        in_subprocess: bool = False,
    ) -> bool:
        """`optimize` when `optimize_needed`; returns whether segments changed."""
        if not self.optimize_needed(generation_id, min_unindexed=min_unindexed):
            return False
        return self.optimize(generation_id, in_subprocess=in_subprocess)

    def start_background_optimizer(
        self,
        interval_s: float = 5.0,
        *,
        min_unindexed: int = 1_000,
        in_subprocess: bool = False,
    ) -> None:
        """Every `interval_s`, `optimize_if_needed` each open generation, one at a time.

        A daemon thread; `close()` stops it (waiting for a running optimize). A second
        call while it runs does nothing. Mind the module docstring: in-process, each
        optimize pauses the whole process.
        """
        with self._lock:
            if self._closed:
                raise OrreryError(ErrorCode.INTERNAL, "vector index is closed")
            if self._optimizer is not None and self._optimizer.is_alive():
                return
            self._stop.clear()
            self._optimizer = threading.Thread(
                target=self._optimize_loop,
                args=(interval_s, min_unindexed, in_subprocess),
                name="qdrant-edge-optimizer",
                daemon=True,
            )
            self._optimizer.start()

    # -- internals ------------------------------------------------------------------

    def _optimize_loop(self, interval_s: float, min_unindexed: int, in_subprocess: bool) -> None:
        while not self._stop.wait(interval_s):
            with self._lock:
                generation_ids = list(self._generations)
            for generation_id in generation_ids:
                if self._stop.is_set():
                    return
                try:
                    if self.optimize_if_needed(
                        generation_id, min_unindexed=min_unindexed, in_subprocess=in_subprocess
                    ):
                        _log.info("optimized qdrant-edge generation %s", generation_id)
                except OrreryError as error:
                    if error.code is not ErrorCode.NOT_FOUND:
                        _log.warning("optimizing %s failed: %s", generation_id, error.message)

    def _optimize_in_subprocess(self, generation_id: str) -> bool:
        with self._lock:
            generation = self._require(generation_id)
            if generation.optimize_lock.locked():
                return False
            self._away.add(generation_id)
            del self._generations[generation_id]
            self._close_generation(generation_id, generation)
        try:
            result = subprocess.run(
                [sys.executable, "-c", _OPTIMIZE_SCRIPT, str(self._path(generation_id))],
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            with self._lock:
                self._away.discard(generation_id)
                if not self._closed:
                    self._open(generation_id)
        if result.returncode != 0:
            raise DependencyUnavailable(
                DEPENDENCY,
                f"optimize {generation_id} in a subprocess failed: {result.stderr.strip()}",
            )
        return result.stdout.strip().endswith("True")

    def _raise_if_away(self, generation_id: str) -> None:
        if generation_id in self._away:
            raise DependencyUnavailable(
                DEPENDENCY,
                f"generation {generation_id!r} is being optimized by a child process",
                {"generation_id": generation_id, "retryable": True},
            )

    def _path(self, generation_id: str) -> Path:
        return self._root / generation_id

    def _get(self, generation_id: str) -> _Generation | None:
        generation = self._generations.get(generation_id)
        if generation is not None:
            return generation
        with self._lock:
            return self._open(generation_id)

    def _require(self, generation_id: str) -> _Generation:
        generation = self._get(generation_id)
        if generation is None:
            raise OrreryError(
                ErrorCode.NOT_FOUND,
                f"vector index generation {generation_id!r} does not exist",
                {"generation_id": generation_id},
            )
        return generation

    def _open(self, generation_id: str) -> _Generation | None:
        """The generation, loading its shard from disk if needed; None if there is none."""
        _check_generation_id(generation_id)
        if self._closed:
            raise OrreryError(ErrorCode.INTERNAL, "vector index is closed")
        generation = self._generations.get(generation_id)
        if generation is not None:
            return generation
        self._raise_if_away(generation_id)
        path = self._path(generation_id)
        if not (path / _CONFIG_FILE).is_file():
            return None
        with _translated(f"load {generation_id}"):
            shard = EdgeShard.load(str(path))
        config = _stored_config(path)
        generation = _Generation(
            shard=shard,
            dimension=_stored_dimension(config, shard),
            indexing_threshold_kb=_stored_indexing_threshold(config, self._tuning),
        )
        self._generations[generation_id] = generation
        return generation

    def _ensure_payload_indexes(self, generation: _Generation) -> None:
        with _translated("create payload indexes"):
            present = generation.shard.info().payload_schema
            for name, schema in _PAYLOAD_INDEXES.items():
                if name not in present:
                    generation.shard.update(UpdateOperation.create_field_index(name, schema))

    @staticmethod
    def _present_revisions(shard: EdgeShard, pids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
        ids: list[PointId] = list(pids)
        records = shard.retrieve(ids, with_payload=["revision"], with_vector=False)
        return {_as_uuid(record.id): int((record.payload or {})["revision"]) for record in records}

    @staticmethod
    def _scroll_pairs(shard: EdgeShard, generation_id: str) -> Iterator[tuple[str, int]]:
        offset: PointId | None = None
        while True:
            with _translated(f"scroll {generation_id}"):
                records, offset = shard.scroll(
                    ScrollRequest(
                        offset=offset,
                        limit=_SCROLL_PAGE,
                        with_payload=["document_id", "revision"],
                        with_vector=False,
                    )
                )
            for record in records:
                payload = record.payload or {}
                yield str(payload["document_id"]), int(payload["revision"])
            if offset is None:
                return

    @staticmethod
    def _close_generation(generation_id: str, generation: _Generation) -> None:
        with generation.optimize_lock, generation.write_lock:
            try:
                generation.shard.flush()
                generation.shard.close()
            except Exception as error:  # the driver raises bare Exception
                _log.warning("closing qdrant-edge generation %s: %s", generation_id, error)


def _check_generation_id(generation_id: str) -> None:
    if not _GENERATION_ID.fullmatch(generation_id):
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "generation ids are 1-128 letters, digits, '_', '.', '-' (used as a directory)",
            {"generation_id": generation_id},
        )


def _check_vector(document: IndexDocument, dimension: int | None) -> None:
    vector = document.vector
    problem: str | None = None
    if vector is None:
        problem = "has no vector"
    elif dimension is not None and len(vector) != dimension:
        problem = f"has a {len(vector)}-d vector, the generation holds {dimension}-d vectors"
    elif not all(math.isfinite(x) for x in vector):
        problem = "has a vector with non-finite values"
    elif not any(vector):
        problem = "has an all-zero vector (cosine is undefined)"
    if problem is not None:
        raise OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"document {document.document_id!r} {problem}",
            {
                "document_id": document.document_id,
                "expected_dimension": dimension,
                "got_dimension": None if vector is None else len(vector),
            },
        )


def _named_vector(document: IndexDocument) -> dict[str, NamedVector]:
    assert document.vector is not None  # checked by _check_vector
    return {VECTOR_NAME: list(document.vector)}


def _as_uuid(pid: PointId) -> uuid.UUID:
    return pid if isinstance(pid, uuid.UUID) else uuid.UUID(str(pid))


def _stored_config(path: Path) -> dict[str, Any]:
    """The shard config qdrant-edge persists as JSON (it offers no getter); {} if unreadable."""
    try:
        config = json.loads((path / _CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _stored_indexing_threshold(config: dict[str, Any], tuning: QdrantEdgeTuning) -> int:
    try:
        return int(config["optimizers"]["indexing_threshold"])
    except (KeyError, TypeError, ValueError):
        return tuning.indexing_threshold_kb


def _stored_dimension(config: dict[str, Any], shard: EdgeShard) -> int | None:
    """The dense dimension a shard was created with.

    From the persisted config; else from one stored vector; else None (the engine still
    rejects a wrong dimension, which `_translated` reports as `EMBEDDER_MISMATCH`).
    """
    try:
        return int(config["vectors"][VECTOR_NAME]["size"])
    except (KeyError, TypeError, ValueError):
        pass
    with _translated("probe dimension"):
        records, _ = shard.scroll(ScrollRequest(limit=1, with_vector=[VECTOR_NAME]))
    for record in records:
        vector = record.vector
        if isinstance(vector, dict):
            dense = vector.get(VECTOR_NAME)
            if isinstance(dense, list):
                return len(dense)
    return None


@contextlib.contextmanager
def _translated(action: str) -> Iterator[None]:
    """Turn the driver's bare `Exception`s into `contracts.errors`."""
    try:
        yield
    except OrreryError:
        raise
    except Exception as error:
        message = str(error)
        if "dimension error" in message:
            raise OrreryError(
                ErrorCode.EMBEDDER_MISMATCH, f"{action}: {message}", {"engine": DEPENDENCY}
            ) from error
        raise DependencyUnavailable(DEPENDENCY, f"{action}: {message}") from error
