"""`SqliteOutboxLog`'s hand-over wait and its batches cut before positions still being
handed over: whatever order and pace the hand-overs come in (at once, in chunks from
another thread, late, never: another writer's rows), of whichever namespaces, the
entries fetched and acknowledged are every outbox row once, in position order, each
equal to what its row decodes to, and a remembered one served as handed over. And one
namespace's announced hand-over holds no other namespace's entries."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contracts.events import LogEntry
from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from projector.adapters.sqlite_outbox_log import SqliteOutboxLog


def _records(start: int, count: int, namespace: str = "ns") -> list[Record]:
    return [
        Record(
            namespace=namespace,
            snapshot_kind="objects",
            item_id=f"d{n}",
            revision=1,
            text={"title": "t", "body": f"b{n}"},
            vector=[0.5, -0.25, float(n % 7) + 1.0],
        )
        for n in range(start, start + count)
    ]


# How a handing-over writer's batch reaches the log: all at once right after the commit,
# held until a later step, its first half now and the rest later, in two chunks from
# another thread while a fetch may be waiting (the second after the wait ran out), or
# from another thread after the wait, announced (`expecting`) from before the write.
HOW = ("now", "later", "halves", "thread", "announced")
# The namespaces writes go to (a batch's hand-over is announced for its own).
SPACES = ("ns", "other-ns")

steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"), st.integers(1, 6), st.sampled_from(HOW), st.sampled_from(SPACES)
        ),
        st.tuples(st.just("other"), st.integers(1, 4), st.just(""), st.sampled_from(SPACES)),
        st.tuples(st.just("release"), st.just(0), st.just(""), st.just("")),
        st.tuples(
            st.just("fetch"), st.integers(1, 8), st.sampled_from(("ack", "reset")), st.just("")
        ),
    ),
    min_size=1,
    max_size=14,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plan=steps, wait=st.sampled_from([0.0, 0.002, 0.02]))
# A fetch that waits, sees the first chunk come and the wait run out before the second.
@example(
    plan=[
        ("write", 2, "now", "ns"),
        ("fetch", 8, "ack", ""),
        ("write", 4, "thread", "ns"),
        ("fetch", 8, "ack", ""),
    ],
    wait=0.02,
)
# Another namespace's rows before and behind a hand-over announced and still on its way.
@example(
    plan=[
        ("write", 2, "now", "other-ns"),
        ("write", 3, "announced", "ns"),
        ("other", 2, "", "other-ns"),
        ("fetch", 8, "ack", ""),
        ("fetch", 8, "ack", ""),
    ],
    wait=0.02,
)
def test_fetches_serve_every_row_once_in_order_however_the_hand_over_comes(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[str, int, str, str]], wait: float
) -> None:
    root = tmp_path_factory.mktemp("handover")
    path: Path = root / "orrery.sqlite"
    handed: list[LogEntry] = []
    store = SqliteRecordStore(path, on_committed=handed.extend)
    other = SqliteRecordStore(path)  # another writer: hands nothing over
    log = SqliteOutboxLog(path, handover_wait_seconds=wait, expected_wait_seconds=10 * wait)
    reading = SqliteOutboxLog(path, handover_wait_seconds=0.0)
    held: list[LogEntry] = []
    remembered: dict[int, LogEntry] = {}
    threads: list[threading.Thread] = []
    served: list[LogEntry] = []
    numbers = itertools.count()

    def remember(entries: list[LogEntry]) -> None:
        remembered.update((e.position, e) for e in entries)
        log.remember(entries)

    def fetch(limit: int, acknowledge: bool) -> None:
        batch = log.fetch(limit)
        expected_start = served[-1].position + 1 if served else 1
        assert [e.position for e in batch] == list(
            range(expected_start, expected_start + len(batch))
        )
        assert all(isinstance(e, LogEntry) for e in batch)
        if acknowledge:
            log.acknowledge(batch)
            served.extend(e for e in batch if isinstance(e, LogEntry))
        else:
            log.reset()

    try:
        for op, count, how, space in plan:
            if op == "write":
                handed.clear()
                announced = log.expecting([space])
                if how == "announced":
                    announced.__enter__()
                store.write(_records(next(numbers) * 10, count, space))
                entries = list(handed)
                if how == "announced":

                    def late(batch: list[LogEntry] = entries, held: Any = announced) -> None:
                        time.sleep(wait * 3)
                        remember(batch)
                        held.__exit__(None, None, None)

                    thread = threading.Thread(target=late)
                    thread.start()
                    threads.append(thread)
                elif how == "now":
                    remember(entries)
                elif how == "later":
                    held.extend(entries)
                elif how == "halves":
                    remember(entries[: len(entries) // 2])
                    held.extend(entries[len(entries) // 2 :])
                else:
                    half = len(entries) // 2
                    first, second = entries[:half], entries[half:]

                    def chunks(a: list[LogEntry] = first, b: list[LogEntry] = second) -> None:
                        # The second chunk later than a fetch waits: cut before it.
                        time.sleep(wait / 2)
                        remember(a)
                        time.sleep(wait * 3)
                        remember(b)

                    thread = threading.Thread(target=chunks)
                    thread.start()
                    threads.append(thread)
            elif op == "other":
                other.write(_records(next(numbers) * 10, count, space))
            elif op == "release":
                remember(held)
                held.clear()
            else:
                fetch(count, how == "ack")
        for thread in threads:
            thread.join()
        remember(held)
        while batch := log.fetch(5):
            log.acknowledge(batch)
            served.extend(e for e in batch if isinstance(e, LogEntry))
        rows = reading.fetch(10_000)
        assert [e.position for e in served] == [e.position for e in rows]
        assert served == rows
        # Whatever was handed over is served from what was handed over.
        assert [e for e in served if e.position in remembered] == [
            remembered[e.position] for e in served if e.position in remembered
        ]
    finally:
        for thread in threads:
            thread.join()
        for closable in (log, reading, store, other):
            closable.close()


def test_an_announced_hand_over_is_waited_for_past_the_hand_over_wait(tmp_path: Path) -> None:
    """While a writer announces its hand-over (`expecting`: a write worker's batch is
    pickled, sent and unpickled after its commit), a fetch waits for it beyond the short
    hand-over wait and serves the entries handed over, not rows decoded again; without
    the announcement the same fetch reads the rows at once."""
    path = tmp_path / "orrery.sqlite"
    handed: list[list[LogEntry]] = []
    store = SqliteRecordStore(path, on_committed=handed.append)
    log = SqliteOutboxLog(path, handover_wait_seconds=0.0, expected_wait_seconds=30.0)
    try:
        store.write(_records(0, 2))
        log.remember(handed[0])
        log.acknowledge(log.fetch(10))
        with log.expecting(["ns"]):
            store.write(_records(10, 3))  # committed; handed over from another thread
            later = threading.Timer(0.2, log.remember, args=(handed[1],))
            later.start()
            served = log.fetch(10)
            later.join()
        assert [e.position for e in served] == [3, 4, 5]
        assert all(s is h for s, h in zip(served, handed[1], strict=True))
        log.acknowledge(served)
        store.write(_records(20, 2))  # handed over, but never given to this log
        decoded = log.fetch(10)
        assert [e.position for e in decoded] == [6, 7]
        assert not any(e is h for e in decoded for h in handed[2])
        assert decoded == handed[2]
    finally:
        log.close()
        store.close()


def _fetched_at_once(log: SqliteOutboxLog, limit: int) -> list[LogEntry]:
    """`log.fetch(limit)` on another thread: what it returned, failing if it still waits
    after a minute (the log under test waits an hour for an announced hand-over)."""
    result: list[list[Any]] = []
    thread = threading.Thread(target=lambda: result.append(log.fetch(limit)), daemon=True)
    thread.start()
    thread.join(60.0)
    assert not thread.is_alive(), "the fetch waits for another namespace's hand-over"
    entries = result[0]
    assert all(isinstance(e, LogEntry) for e in entries)
    return entries


def test_an_announced_hand_over_holds_no_other_namespaces_entries(tmp_path: Path) -> None:
    """Namespace "a"'s batch is committed and its hand-over announced, and never comes
    while "b" writes before and after it: "b"'s entries before it are served at once
    (the batch ends before "a"'s), and those behind it — handed over, or written by
    another writer before or while the fetch waits — end the wait: "a"'s rows are read
    from the table and "b"'s served with them, not an hour later; "b"'s own announced
    hand-over behind "a"'s is waited for, and its arrival ends the wait for "a"'s too.
    "a"'s rows alone wait for their own hand-over
    (`test_an_announced_hand_over_is_waited_for_past_the_hand_over_wait`)."""
    path = tmp_path / "orrery.sqlite"
    handed: list[list[LogEntry]] = []
    store = SqliteRecordStore(path, on_committed=handed.append)
    other = SqliteRecordStore(path)  # another writer: hands nothing over
    log = SqliteOutboxLog(path, handover_wait_seconds=0.0, expected_wait_seconds=3600.0)
    reading = SqliteOutboxLog(path, handover_wait_seconds=0.0)
    try:
        store.write(_records(0, 2, "b"))  # positions 1-2, handed over
        log.remember(handed[-1])
        with log.expecting(["a"]):
            store.write(_records(10, 3, "a"))  # 3-5: its hand-over never comes
            first = _fetched_at_once(log, 10)
            assert [e.position for e in first] == [1, 2]
            assert all(s is h for s, h in zip(first, handed[0], strict=True))
            log.acknowledge(first)

            store.write(_records(20, 2, "b"))  # 6-7, handed over behind "a"'s
            log.remember(handed[-1])
            second = _fetched_at_once(log, 10)
            assert [e.position for e in second] == [3, 4, 5, 6, 7]
            assert second[3:] == handed[-1]
            assert all(s is h for s, h in zip(second[3:], handed[-1], strict=True))
            log.acknowledge(second)

            store.write(_records(30, 2, "a"))  # 8-9: announced, never handed over
            other.write(_records(40, 1, "b"))  # 10: another writer's, behind them
            third = _fetched_at_once(log, 10)
            assert [e.position for e in third] == [8, 9, 10]
            log.acknowledge(third)

            store.write(_records(50, 2, "a"))  # 11-12
            # "b"'s row comes while the fetch waits: the wait looks for it.
            later = threading.Timer(0.2, other.write, args=(_records(60, 1, "b"),))
            later.start()
            fourth = _fetched_at_once(log, 10)
            later.join()
            assert [e.position for e in fourth] == [11, 12]
            log.acknowledge(fourth)
            fifth = _fetched_at_once(log, 10)
            assert [e.position for e in fifth] == [13]
            log.acknowledge(fifth)

            store.write(_records(70, 2, "a"))  # 14-15
            with log.expecting(["b"]):
                store.write(_records(80, 2, "b"))  # 16-17: "b"'s own hand-over, on its way
                later = threading.Timer(0.2, log.remember, args=(handed[-1],))
                later.start()
                # "b"'s rows wait for their own hand-over, whose arrival ends the wait
                # for "a"'s before them too.
                sixth = _fetched_at_once(log, 10)
                later.join()
            assert [e.position for e in sixth] == [14, 15, 16, 17]
            assert all(s is h for s, h in zip(sixth[2:], handed[-1], strict=True))
            log.acknowledge(sixth)
        served = [*first, *second, *third, *fourth, *fifth, *sixth]
        assert served == reading.fetch(17)
    finally:
        for closable in (log, reading, store, other):
            closable.close()
