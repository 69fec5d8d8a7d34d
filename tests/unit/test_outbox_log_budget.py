"""The embedded event log reads at most `MAX_FETCH_BYTES` of events per fetch (issue 22:
a projector batch of large records is cut short instead of loading them all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.events import LogEntry
from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from projector.adapters import sqlite_outbox_log
from projector.adapters.sqlite_outbox_log import SqliteOutboxLog


def test_a_fetch_stops_after_its_byte_budget_and_the_next_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "orrery.sqlite"
    store = SqliteRecordStore(path)
    records = [
        Record(
            namespace="ns",
            snapshot_kind="objects",
            item_id=f"r{n}",
            revision=1,
            payload={"blob": "x" * 300_000},
        )
        for n in range(5)
    ]
    store.write(records)
    store.close()
    monkeypatch.setattr(sqlite_outbox_log, "MAX_FETCH_BYTES", 700_000)
    log = SqliteOutboxLog(path)
    try:
        first = log.fetch(100)
        assert [e.position for e in first] == [1, 2, 3]  # the third passes the budget
        assert all(isinstance(e, LogEntry) for e in first)
        log.acknowledge(first)
        assert [e.position for e in log.fetch(100)] == [4, 5]
    finally:
        log.close()
