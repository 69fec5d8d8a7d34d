"""`ingest.entrypoints.relay.RelayLoop` woken by commits (server mode on PostgreSQL): a
woken relay claims no sooner than `min_interval_seconds` after its previous step began,
so commits that come faster are published together; a step that may have left rows
behind is followed at once. The outbox is played by the test: a list of positions, the
step publishes every row committed and not yet published, in order."""

from __future__ import annotations

import threading
import time

from ingest.entrypoints.relay import RelayLoop


class Outbox:
    def __init__(self, take_at_most: int) -> None:
        self.committed: list[int] = []
        self.published: list[int] = []
        self.steps: list[tuple[float, int]] = []  # (monotonic start, rows published)
        self.take_at_most = take_at_most
        self.lock = threading.Lock()
        self.stepped = threading.Condition(self.lock)

    def commit(self, rows: int) -> None:
        with self.lock:
            start = len(self.committed) + 1
            self.committed.extend(range(start, start + rows))

    def step(self) -> int:
        started = time.monotonic()
        with self.lock:
            taken = self.committed[len(self.published) :][: self.take_at_most]
            self.published.extend(taken)
            self.steps.append((started, len(taken)))
            self.stepped.notify_all()
        return len(taken)

    def wait_for(self, published: int) -> None:
        with self.lock:
            assert self.stepped.wait_for(lambda: len(self.published) >= published, 60)


def test_commits_during_the_interval_are_published_by_one_step() -> None:
    outbox = Outbox(take_at_most=1_000)
    outbox.commit(3)
    loop = RelayLoop(
        outbox.step, poll_seconds=3_600.0, min_interval_seconds=2.0, drained_below=1_000
    )
    loop.start()
    try:
        outbox.wait_for(3)
        for _ in range(10):  # ten commits, each waking the relay
            outbox.commit(1)
            loop.wake()
        outbox.wait_for(13)
    finally:
        loop.stop()
    assert outbox.published == list(range(1, 14))
    published = [rows for _, rows in outbox.steps if rows]
    assert published == [3, 10]
    starts = [started for started, _ in outbox.steps]
    assert starts[1] - starts[0] >= 2.0


def test_a_step_that_may_have_left_rows_is_followed_at_once() -> None:
    """`drained_below` 5: a step that published 5 goes on without a wake (the poll is an
    hour), one that published fewer waits for one."""
    outbox = Outbox(take_at_most=5)
    outbox.commit(12)
    loop = RelayLoop(outbox.step, poll_seconds=3_600.0, min_interval_seconds=0.0, drained_below=5)
    loop.start()
    try:
        outbox.wait_for(12)
        outbox.commit(4)
        loop.wake()
        outbox.wait_for(16)
    finally:
        loop.stop()
    assert outbox.published == list(range(1, 17))
    assert [rows for _, rows in outbox.steps] == [5, 5, 2, 4]


def test_without_a_minimum_interval_a_wake_claims_at_once() -> None:
    outbox = Outbox(take_at_most=1_000)
    loop = RelayLoop(outbox.step, poll_seconds=3_600.0)
    loop.start()
    try:
        for expected in (1, 2, 3):
            with outbox.lock:
                assert outbox.stepped.wait_for(lambda n=expected: len(outbox.steps) >= n, 60)
            outbox.commit(1)
            loop.wake()
            outbox.wait_for(expected)
    finally:
        loop.stop()
    assert outbox.published == [1, 2, 3]
