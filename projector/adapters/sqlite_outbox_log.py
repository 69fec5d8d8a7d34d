"""The embedded event log: ingest's SQLite outbox table, read by position."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from contracts.errors import DependencyUnavailable
from contracts.events import LogEntry, RecordChanged

__all__ = ["SqliteOutboxLog"]


class SqliteOutboxLog:
    """`EventLog` over the outbox table (positions are outbox row ids).

    Guarantees: entries come back in position order; a position is never reused. Rows
    appear only after the writing transaction committed, so a reader never sees an
    event whose record is not stored. The reader's position is the projector's
    (`start_after`, stored in the same transaction as its effects), so acknowledging
    only moves the in-memory mark that `reset` returns to.
    """

    def __init__(self, path: Path, *, start_after: int = 0) -> None:
        self._lock = threading.Lock()
        self._cursor = start_after
        self._acknowledged = start_after
        try:
            self._conn = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {path}: {exc}") from exc

    def fetch(self, limit: int) -> list[LogEntry]:
        try:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT position, event_json FROM outbox WHERE position > ? "
                    "ORDER BY position LIMIT ?",
                    (self._cursor, limit),
                ).fetchall()
                if rows:
                    self._cursor = int(rows[-1][0])
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return [
            LogEntry(position=int(pos), event=RecordChanged.model_validate_json(body))
            for pos, body in rows
        ]

    def acknowledge(self, entries: Sequence[LogEntry]) -> None:
        if entries:
            with self._lock:
                self._acknowledged = max(self._acknowledged, max(e.position for e in entries))

    def reset(self) -> None:
        with self._lock:
            self._cursor = self._acknowledged

    def high_water(self) -> int:
        try:
            with self._lock:
                row = self._conn.execute("SELECT COALESCE(MAX(position), 0) FROM outbox").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()
