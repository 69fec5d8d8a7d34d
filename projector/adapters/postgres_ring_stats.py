"""Ring statistics per generation in PostgreSQL (server mode with `ORRERY_DATABASE_URL`).

The tables `ring_members` and `ring_stats` of the projector's migration set
(`postgres_migrations/0002_ring_statistics.sql`), the same layout and bookkeeping as
`projector.adapters.sqlite_ring_stats`; query workers read `ring_stats`
(`query.adapters.postgres_ring_stats`).
"""

from __future__ import annotations

import functools
import weakref
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

# A batch's `ring_members` rows go to this session's temporary table by binary COPY
# (psycopg's C row writer), then into `ring_members` by one upsert: `executemany` sent
# and adapted them one by one (two thirds of `apply`'s CPU in the projector).
_MEMBERS_IN = "orrery_ring_members_in"
_CREATE_MEMBERS_IN = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_MEMBERS_IN} "
    "(document_id TEXT, revision BIGINT, deleted BOOLEAN, galaxy TEXT, ring TEXT, "
    "vector BYTEA) ON COMMIT DELETE ROWS"
)
_COPY_MEMBERS = f"COPY {_MEMBERS_IN} FROM STDIN (FORMAT BINARY)"
_MEMBER_TYPES = ("text", "int8", "bool", "text", "text", "bytea")
_UPSERT_MEMBERS = (
    "INSERT INTO ring_members SELECT %s, document_id, revision, deleted, galaxy, ring, "
    f"vector FROM {_MEMBERS_IN} "
    "ON CONFLICT (generation_id, document_id) DO UPDATE SET "
    "revision = excluded.revision, deleted = excluded.deleted, "
    "galaxy = excluded.galaxy, ring = excluded.ring, vector = excluded.vector"
)


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
        # The pool's connections that hold `_MEMBERS_IN` (a session's temporary table).
        self._prepared: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()

    @contextmanager
    def _transaction(self, what: str, generation_id: str) -> Iterator[Cursor]:
        with driver_errors(what), self._pool.connection() as conn:
            with conn.transaction(), conn.cursor() as cur:
                created = conn not in self._prepared
                if created:
                    # IF NOT EXISTS: a connection of the pool may have been replaced.
                    cur.execute(_CREATE_MEMBERS_IN)
                cur.execute(
                    "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                    (_RING_LOCK_CLASS, generation_id),
                )
                yield cur
            if created:
                # Committed: a rolled-back transaction takes its CREATE with it.
                self._prepared.add(conn)

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
            if rows:
                # One row per document (`newest_changes`): the upsert meets each once.
                with cur.copy(_COPY_MEMBERS) as copy:
                    copy.set_types(_MEMBER_TYPES)
                    for row in rows:
                        copy.write_row(row)
                cur.execute(_UPSERT_MEMBERS, (generation_id,))
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
        """Every changed ring's row read in one statement and written in one pipeline
        (one round trip each, not two per ring)."""
        if not deltas:
            return
        keys = sorted(deltas)
        cur.execute(
            "SELECT s.galaxy, s.ring, s.documents, s.vector_sum, s.unit_sum FROM ring_stats s "
            "JOIN ROWS FROM (json_array_elements_text(%s::json), "
            "json_array_elements_text(%s::json)) AS k(galaxy, ring) "
            "ON s.galaxy = k.galaxy AND s.ring = k.ring WHERE s.generation_id = %s",
            (
                to_json([galaxy for galaxy, _ in keys]).decode(),
                to_json([ring for _, ring in keys]).decode(),
                generation_id,
            ),
        )
        held_rows: dict[tuple[str, str], tuple[int, bytes, bytes]] = {
            (str(galaxy), str(ring)): (int(documents), bytes(vector_sum), bytes(unit_sum))
            for galaxy, ring, documents, vector_sum, unit_sum in cur.fetchall()
        }
        gone: list[tuple[str, str, str]] = []
        kept: list[tuple[str, str, str, int, bytes, bytes]] = []
        for galaxy, ring in keys:
            sums = settled_sums(
                deltas[(galaxy, ring)],
                held_rows.get((galaxy, ring)),
                functools.partial(_live_vectors, cur, generation_id, galaxy, ring),
            )
            if sums is None:
                continue
            documents, vector_sum, unit_sum = sums
            if documents <= 0:
                gone.append((generation_id, galaxy, ring))
            else:
                kept.append(
                    (
                        generation_id,
                        galaxy,
                        ring,
                        documents,
                        vector_sum.tobytes(),
                        unit_sum.tobytes(),
                    )
                )
        if gone:
            cur.executemany(
                "DELETE FROM ring_stats WHERE generation_id = %s AND galaxy = %s AND ring = %s",
                gone,
            )
        if kept:
            cur.executemany(
                "INSERT INTO ring_stats VALUES (%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (generation_id, galaxy, ring) DO UPDATE SET "
                "documents = excluded.documents, vector_sum = excluded.vector_sum, "
                "unit_sum = excluded.unit_sum",
                kept,
            )


def _live_vectors(cur: Cursor, generation_id: str, galaxy: str, ring: str) -> list[bytes]:
    cur.execute(
        "SELECT vector FROM ring_members WHERE generation_id = %s AND galaxy = %s AND "
        "ring = %s AND NOT deleted AND vector IS NOT NULL",
        (generation_id, galaxy, ring),
    )
    return [bytes(blob) for (blob,) in cur.fetchall()]
