"""The relay's view of the SQLite outbox: unpublished rows in order, and marking them."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from contracts.errors import DependencyUnavailable
from contracts.events import outbox_event_json
from ingest.adapters.sqlite_store import SCHEMA, connect
from ingest.relay_ports import OutboxRow

__all__ = ["SqliteOutboxReader"]

# Far below SQLite's bound-parameter limit, and keeps each UPDATE short.
_MARK_CHUNK = 500


def _utc_now() -> datetime:
    return datetime.now(UTC)


class SqliteOutboxReader:
    """`OutboxRelaySource` over the canonical SQLite file's `outbox` table.

    Guarantees: `unpublished` reads through the partial index `outbox_unpublished`, so
    its cost does not grow with the number of rows already published; `mark_published`
    sets `published_at` in one transaction (all given positions or none) and never
    overwrites an earlier mark. Safe to use next to a `SqliteRecordStore` on the same
    file, in this or another process (WAL: the reader never blocks the writer).
    """

    def __init__(self, path: Path, *, clock: Callable[[], datetime] = _utc_now) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        try:
            self._conn = connect(path)
            self._conn.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {path}: {exc}") from exc

    def unpublished(self, limit: int) -> list[OutboxRow]:
        try:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT o.position, o.document_id, o.namespace, o.event_json, r.record_json, "
                    "o.trace_context "
                    "FROM outbox o LEFT JOIN records r ON r.document_id = o.document_id "
                    "AND r.revision = o.revision "
                    "WHERE o.published_at IS NULL ORDER BY o.position LIMIT ?",
                    (limit,),
                ).fetchall()
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return [
            OutboxRow(int(pos), str(doc), str(ns), str(outbox_event_json(event, record)), trace)
            for pos, doc, ns, event, record, trace in rows
        ]

    def mark_published(self, positions: Sequence[int]) -> None:
        if not positions:
            return
        stamp = self._clock().astimezone(UTC).isoformat()
        unique = sorted(set(positions))
        try:
            with self._lock:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    for start in range(0, len(unique), _MARK_CHUNK):
                        chunk = unique[start : start + _MARK_CHUNK]
                        marks = ",".join("?" * len(chunk))
                        self._conn.execute(
                            f"UPDATE outbox SET published_at = ? "
                            f"WHERE published_at IS NULL AND position IN ({marks})",
                            (stamp, *chunk),
                        )
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", str(exc)) from exc

    def pending(self) -> int:
        try:
            with self._lock:
                (count,) = self._conn.execute(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL"
                ).fetchone()
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return int(count)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
