"""The only module of ingest that picks adapters."""

from __future__ import annotations

from pathlib import Path

from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.ports import RecordStore

__all__ = ["canonical_db_path", "embedded_store"]


def canonical_db_path(data_dir: Path) -> Path:
    return data_dir / "orrery.sqlite"


def embedded_store(data_dir: Path) -> RecordStore:
    """The canonical store of the embedded deployment: SQLite with its outbox."""
    return SqliteRecordStore(canonical_db_path(data_dir))
