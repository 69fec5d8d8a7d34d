"""Conformance suite of the `EventLog` port (projector input).

Each engine gets a producer side (how accepted records reach the log), the log, and a
way to reopen the log as a restarted consumer would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from projector.adapters.sqlite_outbox_log import SqliteOutboxLog
from projector.ports import EventLog


@dataclass
class LogHarness:
    append: Callable[[list[Record]], None]
    open_log: Callable[[int], EventLog]
    closers: list[Callable[[], None]] = field(default_factory=list)

    def log(self, committed: int = 0) -> EventLog:
        """A consumer whose durable position is `committed` (what a restart resumes at)."""
        log = self.open_log(committed)
        self.closers.append(log.close)
        return log

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def _sqlite(tmp: Path) -> LogHarness:
    store = SqliteRecordStore(tmp / "orrery.sqlite")

    def append(records: list[Record]) -> None:
        store.write(records)

    def open_log(committed: int) -> EventLog:
        return SqliteOutboxLog(tmp / "orrery.sqlite", start_after=committed)

    return LogHarness(append, open_log, [store.close])


FACTORIES: dict[str, Callable[[Path], LogHarness]] = {"sqlite-outbox": _sqlite}


@pytest.fixture(params=sorted(FACTORIES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogHarness]:
    instance = FACTORIES[request.param](tmp_path)
    yield instance
    instance.close()


def rec(item: str, revision: int) -> Record:
    return Record(namespace="ns", snapshot_kind="objects", item_id=item, revision=revision)


def drain(log: EventLog, limit: int = 100) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    while batch := log.fetch(limit):
        out.extend((e.event.record.item_id, e.event.revision) for e in batch)
    return out


def test_empty_log(harness: LogHarness) -> None:
    log = harness.log()
    assert log.fetch(10) == []
    assert log.high_water() == 0


def test_delivers_in_order_per_document(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1)])
    harness.append([rec("a", 2)])
    log = harness.log()
    got = drain(log, limit=2)
    assert sorted(got) == [("a", 1), ("a", 2), ("b", 1)]
    assert [r for r in got if r[0] == "a"] == [("a", 1), ("a", 2)]
    assert log.high_water() >= 3


def test_positions_are_outbox_positions(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1)])
    log = harness.log()
    entries = log.fetch(10)
    positions = sorted(e.position for e in entries)
    assert len(set(positions)) == 2 and positions[-1] == log.high_water()


def test_unacknowledged_entries_are_delivered_again_after_reset(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1)])
    log = harness.log()
    first = log.fetch(10)
    assert len(first) == 2
    log.reset()
    again = log.fetch(10)
    assert sorted(e.position for e in again) == sorted(e.position for e in first)


def test_acknowledged_entries_are_not_delivered_again(harness: LogHarness) -> None:
    harness.append([rec("a", 1)])
    log = harness.log()
    first = log.fetch(10)
    log.acknowledge(first)
    harness.append([rec("b", 1)])
    log.reset()
    assert [e.event.record.item_id for e in log.fetch(10)] == ["b"]


def test_restart_resumes_after_the_committed_position(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1), rec("c", 1)])
    log = harness.log()
    entries = log.fetch(1)
    log.acknowledge(entries)
    restarted = harness.log(committed=entries[0].position)
    assert sorted(i for i, _ in drain(restarted)) == ["b", "c"]


def test_event_carries_the_whole_record(harness: LogHarness) -> None:
    record = Record.model_validate(
        {"namespace": "ns", "snapshot_kind": "objects", "item_id": "x", "revision": 1,
         "payload": {"ä": [1, 2]}, "text": {"title": "T", "body": "B", "tags": ["t"]}}
    )
    harness.append([record])
    (entry,) = harness.log().fetch(10)
    assert entry.event.record == record
