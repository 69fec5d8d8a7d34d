"""A namespace's log read from an embedded file the writers have not opened since the
relay recorded placements (no `kafka_partition` column, no `projector_partition_offsets`
table): read as a log of one order, never as an empty one."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from query.adapters.sqlite_routing import SqliteRouting

_BEFORE_PLACEMENTS = """
CREATE TABLE outbox (
    position INTEGER PRIMARY KEY, document_id TEXT, revision INTEGER, namespace TEXT,
    snapshot_kind TEXT, event_json TEXT, created_at TEXT, published_at TEXT
);
CREATE TABLE projector_namespace_positions (
    namespace TEXT PRIMARY KEY, position INTEGER, updated_at TEXT
);
CREATE TABLE dead_letters (seq INTEGER PRIMARY KEY, namespace TEXT);
"""


def test_a_file_from_before_placements_is_read_as_one_order(tmp_path: Path) -> None:
    db = tmp_path / "orrery.sqlite"
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.executescript(_BEFORE_PLACEMENTS)
        conn.executemany(
            "INSERT INTO outbox VALUES (?, ?, 1, 'ns', 'k', '{}', ?, NULL)",
            [(1, "a", "2026-01-01T00:00:00+00:00"), (2, "b", "2026-01-01T00:00:01+00:00")],
        )
        conn.execute("INSERT INTO projector_namespace_positions VALUES ('ns', 1, 'x')")
    log = SqliteRouting(db).namespace_log("ns", 1)
    assert (log.high_water, log.pending, log.applied) == (2, 1, 1)
    assert log.oldest_pending_at is not None and log.oldest_pending_at.second == 1
