"""Ring statistics per generation in PostgreSQL (server mode with `ORRERY_DATABASE_URL`).

The tables `ring_members` and `ring_stats` of the projector's migration set
(`postgres_migrations/0002_ring_statistics.sql`), the same layout and bookkeeping as
`projector.adapters.sqlite_ring_stats`; query workers read `ring_stats`
(`query.adapters.postgres_ring_stats`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool
from pydantic_core import to_json

from contracts.index import IndexDocument
from projector.adapters.postgres_pool import driver_errors, open_pool
from projector.ring_stats import (
    RingDelta,
    RingMember,
    member_vector,
    newest_changes,
    ring_moves,
    settled_sums,
)

__all__ = ["PostgresRingStatistics"]

# "ring" in ASCII: the class of the per-generation transaction lock (two-key advisory
# locks never meet the one-key locks of the registry and the writer lock).
_RING_LOCK_CLASS = 0x72696E67

Cursor = psycopg.Cursor[Any]


class PostgresRingStatistics:
    """`projector.ports.RingStatistics` in PostgreSQL; the guarantees of
    `SqliteRingStatistics`: one transaction per `apply`, idempotent on
    `(document_id, revision)` (an upsert never replaces its own or a newer revision; a
    delete at r removes r or older and stays as a tombstone at r), a document's
    contribution moves with it, float32 vectors summed exactly as added.

    Writers of one generation (the projector, a bulk-load child, a hand-over replay on
    another machine) take a transaction-level advisory lock on the generation first, so
    their read-modify-writes of a ring's sums never interleave. Driver errors raise
    `DependencyUnavailable`."""

    def __init__(self, url: str, *, pool_size: int = 2) -> None:
        self._pool: ConnectionPool = open_pool(url, max_size=pool_size, name="orrery-ring-stats")

    @contextmanager
    def _transaction(self, what: str, generation_id: str) -> Iterator[Cursor]:
        with (
            driver_errors(what),
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor() as cur,
        ):
            cur.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                (_RING_LOCK_CLASS, generation_id),
            )
            yield cur

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
        with self._transaction("write ring statistics", generation_id) as cur:
            members = self._members(cur, generation_id, sorted(changes))
            rows, deltas = ring_moves(changes, members)
            cur.executemany(
                "INSERT INTO ring_members VALUES (%s,%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (generation_id, document_id) DO UPDATE SET "
                "revision = excluded.revision, deleted = excluded.deleted, "
                "galaxy = excluded.galaxy, ring = excluded.ring, vector = excluded.vector",
                [(generation_id, *row) for row in rows],
            )
            self._add(cur, generation_id, deltas)

    def drop(self, generation_id: str) -> None:
        """Forget a generation's statistics (no-op if it has none)."""
        with self._transaction("drop ring statistics", generation_id) as cur:
            cur.execute("DELETE FROM ring_members WHERE generation_id = %s", (generation_id,))
            cur.execute("DELETE FROM ring_stats WHERE generation_id = %s", (generation_id,))

    def close(self) -> None:
        self._pool.close()

    @staticmethod
    def _members(
        cur: Cursor, generation_id: str, document_ids: Sequence[str]
    ) -> dict[str, RingMember]:
        cur.execute(
            "SELECT document_id, revision, deleted, galaxy, ring, vector FROM ring_members "
            "WHERE generation_id = %s AND "
            "document_id = ANY(ARRAY(SELECT json_array_elements_text(%s::json)))",
            # One JSON parameter: psycopg adapts a list parameter item by item in Python.
            (generation_id, to_json(list(document_ids)).decode()),
        )
        out: dict[str, RingMember] = {}
        for document_id, revision, deleted, galaxy, ring, blob in cur.fetchall():
            vector = member_vector(bool(deleted), None if blob is None else bytes(blob))
            out[str(document_id)] = (int(revision), vector, str(galaxy), str(ring))
        return out

    @staticmethod
    def _add(cur: Cursor, generation_id: str, deltas: dict[tuple[str, str], RingDelta]) -> None:
        for (galaxy, ring), delta in sorted(deltas.items()):
            cur.execute(
                "SELECT documents, vector_sum, unit_sum FROM ring_stats "
                "WHERE generation_id = %s AND galaxy = %s AND ring = %s",
                (generation_id, galaxy, ring),
            )
            row = cur.fetchone()
            held = None if row is None else (int(row[0]), bytes(row[1]), bytes(row[2]))
            sums = settled_sums(
                delta,
                held,
                functools.partial(_live_vectors, cur, generation_id, galaxy, ring),
            )
            if sums is None:
                continue
            documents, vector_sum, unit_sum = sums
            if documents <= 0:
                cur.execute(
                    "DELETE FROM ring_stats WHERE generation_id = %s AND galaxy = %s AND ring = %s",
                    (generation_id, galaxy, ring),
                )
                continue
            cur.execute(
                "INSERT INTO ring_stats VALUES (%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (generation_id, galaxy, ring) DO UPDATE SET "
                "documents = excluded.documents, vector_sum = excluded.vector_sum, "
                "unit_sum = excluded.unit_sum",
                (generation_id, galaxy, ring, documents, vector_sum.tobytes(), unit_sum.tobytes()),
            )


def _live_vectors(cur: Cursor, generation_id: str, galaxy: str, ring: str) -> list[bytes]:
    cur.execute(
        "SELECT vector FROM ring_members WHERE generation_id = %s AND galaxy = %s AND "
        "ring = %s AND NOT deleted AND vector IS NOT NULL",
        (generation_id, galaxy, ring),
    )
    return [bytes(blob) for (blob,) in cur.fetchall()]
