"""A SQLite store that hands its committed events over checkpoints its WAL itself, after
the hand-over (SQLite's automatic checkpoint, inside `COMMIT`, is off for its
connection): the database file alone holds what was written once enough was."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from contracts.events import LogEntry
from contracts.records import Record
from ingest.adapters.sqlite_store import CHECKPOINT_RECORD_BYTES, SqliteRecordStore, connect


def _records(count: int, size: int) -> list[Record]:
    return [
        Record(
            namespace="ns",
            snapshot_kind="objects",
            item_id=f"i{n}",
            revision=1,
            text={"title": "t", "body": "x" * size},
        )
        for n in range(count)
    ]


def _rows_in_file_alone(path: Path, tmp: Path) -> int:
    """Records in a copy of the database file without its WAL (0 before its tables)."""
    copy = tmp / "alone.sqlite"
    copy.unlink(missing_ok=True)
    shutil.copyfile(path, copy)
    conn = sqlite3.connect(copy)
    try:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE name = 'records'").fetchall()
        if not tables:
            return 0
        return int(conn.execute("SELECT COUNT(*) FROM records").fetchone()[0])
    finally:
        conn.close()


def test_a_handing_over_store_checkpoints_after_the_hand_over(tmp_path: Path) -> None:
    path = tmp_path / "orrery.sqlite"
    seen: list[tuple[int, int]] = []

    def handed(entries: list[LogEntry]) -> None:
        # At the hand-over the batch's rows are committed (another connection reads
        # them) and not yet copied into the database file by a checkpoint.
        with sqlite3.connect(path) as reader:
            committed = reader.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        seen.append((committed, _rows_in_file_alone(path, tmp_path)))

    store = SqliteRecordStore(path, on_committed=handed)
    try:
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        batch = _records(40, CHECKPOINT_RECORD_BYTES // 20)  # 2x the checkpoint's bytes
        store.write(batch)
        assert seen == [(40, 0)]
        # Checkpointed after the hand-over: the file alone holds the batch.
        assert _rows_in_file_alone(path, tmp_path) == 40
    finally:
        store.close()


def test_a_store_without_hand_over_keeps_sqlites_checkpoint(tmp_path: Path) -> None:
    store = SqliteRecordStore(tmp_path / "orrery.sqlite")
    try:
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
    finally:
        store.close()


def test_the_canonical_store_syncs_every_commit(tmp_path: Path) -> None:
    """An acknowledged write is on disk, not only in the OS's cache: the store's
    connections sync the WAL at every commit (`synchronous=FULL`, 2), the writer's and
    a connection opened beside it alike (the relay's, through `connect`)."""
    store = SqliteRecordStore(tmp_path / "orrery.sqlite")
    other = connect(tmp_path / "orrery.sqlite")
    try:
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert other.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()
        store.close()
