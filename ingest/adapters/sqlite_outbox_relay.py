"""The relay's view of the SQLite outbox: unpublished rows in order, and marking them."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from contracts.errors import DependencyUnavailable
from ingest.adapters.sqlite_store import (
    SCHEMA,
    add_placement_columns,
    add_trace_column,
    add_vector_column,
    connect,
)
from ingest.relay_ports import OutboxRow, Placement, claimed_rows

__all__ = ["SqliteOutboxReader"]

# Far below SQLite's bound-parameter limit, and keeps each UPDATE short.
_MARK_CHUNK = 500


def _utc_now() -> datetime:
    return datetime.now(UTC)


class SqliteOutboxReader:
    """`OutboxRelaySource` over the canonical SQLite file's `outbox` table.

    Guarantees: `unpublished` reads through the partial index `outbox_unpublished`, so
    its cost does not grow with the number of rows already published; `mark_published`
    sets `published_at` (and the log's placement of each row, when given) in one
    transaction (all given positions or none) and never overwrites an earlier mark.
    Safe to use next to a `SqliteRecordStore` on the same file, in this or another
    process (WAL: the reader never blocks the writer).
    """

    def __init__(self, path: Path, *, clock: Callable[[], datetime] = _utc_now) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        try:
            self._conn = connect(path)
            self._conn.executescript(SCHEMA)
            add_trace_column(self._conn)
            add_vector_column(self._conn)
            add_placement_columns(self._conn)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {path}: {exc}") from exc

    def unpublished(self, limit: int) -> list[OutboxRow]:
        try:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT o.position, o.document_id, o.namespace, o.event_json, r.record_json, "
                    "o.trace_context, r.vector_f32 "
                    "FROM outbox o LEFT JOIN records r ON r.document_id = o.document_id "
                    "AND r.revision = o.revision "
                    "WHERE o.published_at IS NULL ORDER BY o.position LIMIT ?",
                    (limit,),
                ).fetchall()
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return claimed_rows(rows)

    def mark_published(
        self, positions: Sequence[int], placements: Sequence[Placement] = ()
    ) -> None:
        if not positions:
            return
        if placements and len(placements) != len(positions):
            raise ValueError(f"{len(placements)} placements for {len(positions)} positions")
        stamp = self._clock().astimezone(UTC).isoformat()
        # A position given twice keeps its last placement (the newest copy on the log).
        placed = {
            int(p): (placements[i] if placements else (None, None)) for i, p in enumerate(positions)
        }
        unique = sorted(placed)
        try:
            with self._lock:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    if placements:
                        self._conn.executemany(
                            "UPDATE outbox SET published_at = ?, kafka_partition = ?, "
                            "kafka_offset = ? WHERE published_at IS NULL AND position = ?",
                            [(stamp, *placed[p], p) for p in unique],
                        )
                    else:
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
