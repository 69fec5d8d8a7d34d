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
import functools
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from contracts.errors import DependencyUnavailable
from contracts.index import IndexDocument
from projector.ring_stats import (
    RingDelta,
    RingMember,
    member_vector,
    newest_changes,
    ring_moves,
    settled_sums,
)

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

_CHUNK = 500


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
        changes = newest_changes(upserts, deletes)
        if not changes:
            return
        with self._transaction() as conn:
            members = self._members(conn, generation_id, sorted(changes))
            rows, deltas = ring_moves(changes, members)
            conn.executemany(
                "INSERT INTO ring_members VALUES (?,?,?,?,?,?,?) "
                "ON CONFLICT(generation_id, document_id) DO UPDATE SET "
                "revision = excluded.revision, deleted = excluded.deleted, "
                "galaxy = excluded.galaxy, ring = excluded.ring, vector = excluded.vector",
                [(generation_id, i, r, int(d), g, ring, v) for i, r, d, g, ring, v in rows],
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
    ) -> dict[str, RingMember]:
        out: dict[str, RingMember] = {}
        for start in range(0, len(document_ids), _CHUNK):
            chunk = list(document_ids[start : start + _CHUNK])
            marks = ",".join("?" * len(chunk))
            for document_id, revision, deleted, galaxy, ring, blob in conn.execute(
                "SELECT document_id, revision, deleted, galaxy, ring, vector FROM ring_members "
                f"WHERE generation_id = ? AND document_id IN ({marks})",
                [generation_id, *chunk],
            ):
                vector = member_vector(bool(deleted), blob)
                out[str(document_id)] = (int(revision), vector, str(galaxy), str(ring))
        return out

    @staticmethod
    def _add(
        conn: sqlite3.Connection, generation_id: str, deltas: dict[tuple[str, str], RingDelta]
    ) -> None:
        for (galaxy, ring), delta in sorted(deltas.items()):
            row = conn.execute(
                "SELECT documents, vector_sum, unit_sum FROM ring_stats "
                "WHERE generation_id = ? AND galaxy = ? AND ring = ?",
                (generation_id, galaxy, ring),
            ).fetchone()
            sums = settled_sums(
                delta,
                None if row is None else (int(row[0]), row[1], row[2]),
                functools.partial(_live_vectors, conn, generation_id, galaxy, ring),
            )
            if sums is None:
                continue
            documents, vector_sum, unit_sum = sums
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


def _live_vectors(
    conn: sqlite3.Connection, generation_id: str, galaxy: str, ring: str
) -> list[bytes]:
    return [
        bytes(blob)
        for (blob,) in conn.execute(
            "SELECT vector FROM ring_members WHERE generation_id = ? AND galaxy = ? AND "
            "ring = ? AND deleted = 0 AND vector IS NOT NULL",
            (generation_id, galaxy, ring),
        )
    ]
