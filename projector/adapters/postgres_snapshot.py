"""The canonical snapshot, read from ingest's PostgreSQL store for builds and checks.

Reads the tables of `ingest/adapters/postgres_migrations` (the packages share no code,
only the schema): `heads`, `records`, `outbox` and `outbox_counter` (the newest position:
positions are gap-free and in commit order, so a transaction that sees the counter at N
sees every event up to N and none after it). Every read is one REPEATABLE READ,
read-only transaction.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from contracts.errors import ErrorCode, OrreryError
from contracts.records import Record
from projector.adapters.postgres_pool import driver_errors, open_pool
from projector.ports import SnapshotKeys

__all__ = ["PostgresCanonicalSnapshot"]

_KEYS_PER_QUERY = 1000


class PostgresCanonicalSnapshot:
    """`CanonicalSnapshot` over the canonical PostgreSQL database; the port's guarantees:
    `snapshot_keys` reads the high-water position and the scope's heads in one snapshot;
    `live_pairs_at(p)` recomputes the live set at any past position from the outbox;
    `records` returns exactly the requested revisions (`INTERNAL` for a missing one)."""

    def __init__(self, url: str, *, pool_size: int = 2) -> None:
        self._pool: ConnectionPool = open_pool(url, max_size=pool_size, name="orrery-snapshot")

    @contextmanager
    def _read(self, what: str) -> Iterator[psycopg.Cursor[Any]]:
        with (
            driver_errors(what),
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor() as cur,
        ):
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield cur

    @staticmethod
    def _high_water(cur: psycopg.Cursor[Any]) -> int:
        cur.execute("SELECT position FROM outbox_counter")
        row = cur.fetchone()
        return 0 if row is None else int(row[0])

    def snapshot_keys(self, namespace: str, snapshot_kind: str) -> SnapshotKeys:
        with self._read("read snapshot keys") as cur:
            high_water = self._high_water(cur)
            cur.execute(
                "SELECT document_id, revision, deleted FROM heads WHERE namespace = %s AND "
                "snapshot_kind = %s ORDER BY document_id",
                (namespace, snapshot_kind),
            )
            rows = cur.fetchall()
        return SnapshotKeys(
            high_water=high_water,
            keys=[(str(d), int(r)) for d, r, deleted in rows if not deleted],
            tombstones=[(str(d), int(r)) for d, r, deleted in rows if deleted],
        )

    def records(self, keys: Sequence[tuple[str, int]]) -> list[Record]:
        out: list[Record] = []
        for start in range(0, len(keys), _KEYS_PER_QUERY):
            chunk = list(keys[start : start + _KEYS_PER_QUERY])
            with self._read("read records") as cur:
                cur.execute(
                    "SELECT r.document_id, r.revision, r.record_json FROM records r JOIN "
                    "unnest(%s::text[], %s::bigint[]) AS k(document_id, revision) "
                    "ON r.document_id = k.document_id AND r.revision = k.revision",
                    ([d for d, _ in chunk], [r for _, r in chunk]),
                )
                found = {(str(d), int(r)): str(body) for d, r, body in cur.fetchall()}
            for key in chunk:
                body = found.get(key)
                if body is None:
                    raise OrreryError(
                        ErrorCode.INTERNAL,
                        f"the canonical store lacks revision {key[1]} of {key[0]}",
                        {"document_id": key[0], "revision": key[1]},
                    )
                out.append(Record.model_validate_json(body))
        return out

    def live_pairs_at(
        self, namespace: str, snapshot_kind: str, position: int
    ) -> list[tuple[str, int]]:
        with self._read("read live pairs") as cur:
            cur.execute(
                "SELECT o.document_id, o.revision FROM (SELECT document_id, MAX(revision) "
                "AS revision FROM outbox WHERE namespace = %s AND snapshot_kind = %s AND "
                "position <= %s GROUP BY document_id) o JOIN records r ON "
                "r.document_id = o.document_id AND r.revision = o.revision WHERE NOT r.deleted",
                (namespace, snapshot_kind, position),
            )
            rows = cur.fetchall()
        return [(str(d), int(r)) for d, r in rows]

    def high_water(self) -> int:
        with self._read("read high water") as cur:
            return self._high_water(cur)

    def close(self) -> None:
        self._pool.close()
