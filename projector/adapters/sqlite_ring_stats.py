"""Ring statistics per generation in the registry's SQLite database.

Two tables next to the generation registry (the embedded format; query workers read
`ring_stats`, see `query.adapters.sqlite_ring_stats`):

- `ring_members`: per generation and document, the revision last applied, whether it
  was a delete, and the document's galaxy, ring and vector (float32) — what must be
  subtracted when the document changes ring or vector, or is deleted;
- `ring_stats`: per generation, galaxy and ring, the live documents, the sum of their
  vectors and the sum of their unit vectors (float64). A ring's centroid is
  `vector_sum / documents`; its mean cosine to the centroid is
  `unit_sum · ĉ / documents`, where ĉ is the centroid's direction.

A ring row exists only while it holds documents: a ring whose last document leaves is
deleted, so no rounding residue of removed vectors stays behind.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from contracts.errors import DependencyUnavailable
from contracts.index import IndexDocument

__all__ = ["RING_STATS_SCHEMA", "SqliteRingStatistics"]

RING_STATS_SCHEMA = """
CREATE TABLE IF NOT EXISTS ring_members (
    generation_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    revision      INTEGER NOT NULL,
    deleted       INTEGER NOT NULL,
    galaxy        TEXT NOT NULL,
    ring          TEXT NOT NULL,
    vector        BLOB,
    PRIMARY KEY (generation_id, document_id)
);
CREATE TABLE IF NOT EXISTS ring_stats (
    generation_id TEXT NOT NULL,
    galaxy        TEXT NOT NULL,
    ring          TEXT NOT NULL,
    documents     INTEGER NOT NULL,
    vector_sum    BLOB NOT NULL,
    unit_sum      BLOB NOT NULL,
    PRIMARY KEY (generation_id, galaxy, ring)
);
"""

_Vector = npt.NDArray[np.float64]
_CHUNK = 500


class _Delta:
    """Changes to one ring's sums within one call."""

    __slots__ = ("documents", "unit_sum", "vector_sum")

    def __init__(self) -> None:
        self.documents = 0
        self.vector_sum: _Vector | None = None
        self.unit_sum: _Vector | None = None

    def add(self, vector: _Vector, sign: int) -> None:
        norm = float(np.linalg.norm(vector))
        unit = vector / norm if norm > 0.0 else vector
        self.documents += sign
        if self.vector_sum is None or self.unit_sum is None:
            self.vector_sum = sign * vector
            self.unit_sum = sign * unit
        else:
            self.vector_sum += sign * vector
            self.unit_sum += sign * unit


class SqliteRingStatistics:
    """`projector.ports.RingStatistics` in SQLite (`ring_members`, `ring_stats`).

    Guarantees: one transaction per `apply`; the engines' rule, idempotent on
    `(document_id, revision)`: an upsert never replaces its own or a newer revision, a
    delete at r removes revision r or older and is remembered as a tombstone at r (an
    older upsert replayed later stays out); a document's contribution moves with it
    (its old ring loses it, its new ring gains it). Vectors are summed as their float32
    values, so what is subtracted is exactly what was added.
    """

    def __init__(self, path: Path) -> None:
        self._lock = threading.RLock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.executescript(RING_STATS_SCHEMA)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {path}: {exc}") from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise DependencyUnavailable("sqlite", str(exc)) from exc

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None:
        """Move each changed document's contribution; see the class guarantees."""
        # The newest change per document within the call wins (a delete at the same
        # revision as an upsert removes it, as in the engines).
        changes: dict[str, tuple[int, IndexDocument | None]] = {}
        for upsert in upserts:
            held = changes.get(upsert.document_id)
            if held is None or upsert.revision > held[0]:
                changes[upsert.document_id] = (upsert.revision, upsert)
        for document_id, revision in deletes:
            held = changes.get(document_id)
            if held is None or revision >= held[0]:
                changes[document_id] = (revision, None)
        if not changes:
            return
        with self._transaction() as conn:
            members = self._members(conn, generation_id, sorted(changes))
            deltas: dict[tuple[str, str], _Delta] = defaultdict(_Delta)
            rows: list[tuple[object, ...]] = []
            for document_id, (revision, change) in sorted(changes.items()):
                old = members.get(document_id)
                # An upsert never replaces its own or a newer revision; a delete at r
                # removes what is at r or older (the engines' rule).
                if old is not None and (
                    old[0] > revision or (old[0] == revision and change is not None)
                ):
                    continue
                if old is not None and old[0] == revision and old[1] is None:
                    continue
                if old is not None and old[1] is not None:
                    deltas[(old[2], old[3])].add(old[1], -1)
                if change is None:
                    rows.append((generation_id, document_id, revision, 1, "", "", None))
                    continue
                doc = change
                if doc.vector is None:
                    raise ValueError(f"document {document_id} has no vector")
                stored = np.asarray(doc.vector, dtype=np.float32)
                deltas[(doc.galaxy, doc.ring)].add(stored.astype(np.float64), 1)
                rows.append(
                    (
                        generation_id,
                        document_id,
                        revision,
                        0,
                        doc.galaxy,
                        doc.ring,
                        stored.tobytes(),
                    )
                )
            conn.executemany(
                "INSERT INTO ring_members VALUES (?,?,?,?,?,?,?) "
                "ON CONFLICT(generation_id, document_id) DO UPDATE SET "
                "revision = excluded.revision, deleted = excluded.deleted, "
                "galaxy = excluded.galaxy, ring = excluded.ring, vector = excluded.vector",
                rows,
            )
            self._add(conn, generation_id, deltas)

    def drop(self, generation_id: str) -> None:
        """Forget a generation's statistics (no-op if it has none)."""
        with self._transaction() as conn:
            conn.execute("DELETE FROM ring_members WHERE generation_id = ?", (generation_id,))
            conn.execute("DELETE FROM ring_stats WHERE generation_id = ?", (generation_id,))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @staticmethod
    def _members(
        conn: sqlite3.Connection, generation_id: str, document_ids: Sequence[str]
    ) -> dict[str, tuple[int, _Vector | None, str, str]]:
        out: dict[str, tuple[int, _Vector | None, str, str]] = {}
        for start in range(0, len(document_ids), _CHUNK):
            chunk = list(document_ids[start : start + _CHUNK])
            marks = ",".join("?" * len(chunk))
            for document_id, revision, deleted, galaxy, ring, blob in conn.execute(
                "SELECT document_id, revision, deleted, galaxy, ring, vector FROM ring_members "
                f"WHERE generation_id = ? AND document_id IN ({marks})",
                [generation_id, *chunk],
            ):
                vector = (
                    None
                    if deleted or blob is None
                    else np.frombuffer(blob, dtype=np.float32).astype(np.float64)
                )
                out[str(document_id)] = (int(revision), vector, str(galaxy), str(ring))
        return out

    @staticmethod
    def _add(
        conn: sqlite3.Connection, generation_id: str, deltas: dict[tuple[str, str], _Delta]
    ) -> None:
        for (galaxy, ring), delta in sorted(deltas.items()):
            if delta.vector_sum is None or delta.unit_sum is None:
                continue
            row = conn.execute(
                "SELECT documents, vector_sum, unit_sum FROM ring_stats "
                "WHERE generation_id = ? AND galaxy = ? AND ring = ?",
                (generation_id, galaxy, ring),
            ).fetchone()
            documents = delta.documents
            vector_sum, unit_sum = delta.vector_sum, delta.unit_sum
            if row is not None:
                old_vectors = np.frombuffer(row[1], dtype=np.float64)
                if old_vectors.shape == vector_sum.shape:
                    documents += int(row[0])
                    vector_sum = vector_sum + old_vectors
                    unit_sum = unit_sum + np.frombuffer(row[2], dtype=np.float64)
            if documents <= 0:
                conn.execute(
                    "DELETE FROM ring_stats WHERE generation_id = ? AND galaxy = ? AND ring = ?",
                    (generation_id, galaxy, ring),
                )
                continue
            conn.execute(
                "INSERT INTO ring_stats VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(generation_id, galaxy, ring) DO UPDATE SET "
                "documents = excluded.documents, vector_sum = excluded.vector_sum, "
                "unit_sum = excluded.unit_sum",
                (generation_id, galaxy, ring, documents, vector_sum.tobytes(), unit_sum.tobytes()),
            )
