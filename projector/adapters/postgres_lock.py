"""The generation writer lock across machines: a PostgreSQL session advisory lock.

`hold()` takes `pg_advisory_lock(key)` on a connection of its own (not pooled) and keeps
it while the holder writes indexes and commits. PostgreSQL drops the lock when that
session ends — a crashed process, a dropped connection, a restarted server — so a lock is
never left behind; but the holder may then still be writing. The holder's commit is
therefore fenced: `assert_held(cursor)` runs inside the commit transaction and fails it
(`DependencyUnavailable`, the batch is not acknowledged and replays) unless the lock's
session still holds the lock. Index writes are idempotent on `(document_id, revision)`,
so the overlap of two writers between the loss and the failed commit leaves nothing
wrong behind.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from contracts.errors import DependencyUnavailable
from projector.adapters.postgres_pool import DEPENDENCY, redact

__all__ = ["GENERATION_LOCK_KEY", "PostgresWriterLock"]

# "orrery-g" in ASCII; advisory locks are scoped per database.
GENERATION_LOCK_KEY = 0x6F72726572792D67


def _split(key: int) -> tuple[int, int]:
    """How pg_locks shows a bigint advisory key: (classid, objid), both unsigned."""
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF


class PostgresWriterLock:
    """`WriterLock` over a PostgreSQL advisory lock: exclusive across threads, processes
    and machines that use the same database.

    Guarantees: `hold()` blocks until no other holder is inside; re-entrant within one
    thread; a lost session fails the holder's next fenced commit (`assert_held`).
    """

    def __init__(self, url: str, *, key: int = GENERATION_LOCK_KEY) -> None:
        self._url = url
        self._key = key
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._owner: int | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._pid: int | None = None

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread_lock:
            if self._depth == 0:
                self._acquire()
            self._depth += 1
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    self._release()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._url,
                autocommit=True,
                connect_timeout=10,
                application_name="orrery-writer-lock",
            )
            row = self._conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            self._pid = int(row[0])
        return self._conn

    def _acquire(self) -> None:
        try:
            self._connection().execute("SELECT pg_advisory_lock(%s)", (self._key,))
        except psycopg.Error as exc:
            self._drop()
            raise DependencyUnavailable(
                DEPENDENCY, f"cannot take the writer lock on {redact(self._url)}: {exc}"
            ) from exc

    def _release(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
        except psycopg.Error:
            # The session is gone, and its lock with it.
            self._drop()

    def _drop(self) -> None:
        conn, self._conn, self._pid = self._conn, None, None
        if conn is not None:
            conn.close()

    def assert_held(self, cursor: psycopg.Cursor[Any]) -> None:
        """Inside a commit transaction (on another connection): raise
        `DependencyUnavailable` when this thread holds the lock but its session no longer
        does. A no-op when the calling thread does not hold it."""
        if self._owner != threading.get_ident() or self._depth == 0:
            return
        classid, objid = _split(self._key)
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid = %s AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
            (self._pid, classid, objid),
        )
        row = cursor.fetchone()
        if self._pid is None or row is None or int(row[0]) != 1:
            raise DependencyUnavailable(
                DEPENDENCY, "the generation writer lock was lost; the batch is not committed"
            )

    def backend_pid(self) -> int | None:
        """The session holding (or last holding) the lock; for tests and diagnostics."""
        return self._pid

    def close(self) -> None:
        with self._thread_lock:
            self._drop()
