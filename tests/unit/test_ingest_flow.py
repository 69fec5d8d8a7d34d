"""`POST /v1/records` paced by the projector's progress (`ingest.entrypoints.http`,
`WriteFlow`): the backlog bound and `?wait=searchable`, over a real SQLite store.

The projector is played by the test: it moves `LogProgress.applied` by hand, so every
state a POST can meet is set up exactly, with no timing involved."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from contracts.admission import MAX_RECORD_BYTES
from contracts.progress import LogProgress
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.entrypoints.http import WriteFlow, create_router
from ingest.model import FlowLimits
from ingest.pacing import ChangeSignal
from orrery.http import build_app


def records(start: int, count: int, namespace: str = "ns") -> list[dict[str, Any]]:
    return [
        {"namespace": namespace, "snapshot_kind": "objects", "item_id": f"i{n}", "revision": 1}
        for n in range(start, start + count)
    ]


def start_writer(
    stack: Any, batch: list[dict[str, Any]], **post: Any
) -> tuple[threading.Thread, list[httpx.Response]]:
    """A thread posting `batch`, started, and the list its answer is appended to."""
    answers: list[httpx.Response] = []
    writer = threading.Thread(target=lambda: answers.append(stack.post(batch, **post)))
    writer.start()
    return writer, answers


def assert_still_waiting(
    writer: threading.Thread, answers: list[httpx.Response], seconds: float = 0.2
) -> None:
    writer.join(seconds)
    assert writer.is_alive() and not answers


class Stack:
    def __init__(
        self, tmp_path: Path, limits: FlowLimits | None, changes: ChangeSignal | None = None
    ) -> None:
        self.progress = LogProgress()

        self.store = SqliteRecordStore(
            tmp_path / "orrery.sqlite", on_positions=self.progress.wrote_events
        )
        # With `changes`, waiting writers read the progress again only when told (the
        # safety-net poll is longer than any test).
        flow = (
            None
            if limits is None
            else WriteFlow(self.progress, limits, poll_seconds=3_600.0, changes=changes)
            if changes is not None
            else WriteFlow(self.progress, limits)
        )
        router = create_router(
            store=self.store,
            grants={},
            max_batch=100,
            vector_dimension=None,
            max_record_bytes=MAX_RECORD_BYTES,
            flow=flow,
        )
        self.client = TestClient(build_app("test", [router]))

    def post(self, body: Any, **params: str) -> httpx.Response:
        return self.client.post("/v1/records", json=body, params=params)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    stacks: list[Stack] = []

    def factory(limits: FlowLimits | None, changes: ChangeSignal | None = None) -> Stack:
        stack = Stack(tmp_path / str(len(stacks)), limits, changes)
        stacks.append(stack)
        return stack

    yield factory
    for stack in stacks:
        stack.client.close()
        stack.store.close()


def test_a_write_beyond_the_backlog_bound_is_refused_and_nothing_is_written(make: Any) -> None:
    stack = make(FlowLimits(max_lag_events=5, backlog_wait_seconds=0.0))
    assert stack.post(records(0, 10)).status_code == 200  # lag 0: admitted
    assert stack.progress.lag() == 10

    refused = stack.post(records(10, 1))
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "ingest_backlog"
    assert error["details"]["lag_events"] == 10
    assert error["details"]["max_lag_events"] == 5
    assert error["details"]["namespace"] == "ns"
    assert stack.store.high_water() == 10  # nothing of the refused batch

    stack.progress.applied_up_to(5)  # lag 5: at the bound, admitted
    accepted = stack.post(records(10, 1))
    assert accepted.status_code == 200
    assert accepted.json()["high_water"] == 11
    assert "searchable" not in accepted.json()


def test_a_writer_waits_for_the_backlog_and_then_writes(make: Any) -> None:
    stack = make(FlowLimits(max_lag_events=5, backlog_wait_seconds=600.0))
    stack.post(records(0, 10))
    writer, answers = start_writer(stack, records(10, 3))
    # Whenever we look, the waiting writer has written nothing: the projector is 10
    # events behind, the bound is 5.
    assert_still_waiting(writer, answers)
    assert stack.store.high_water() == 10
    stack.progress.applied_up_to(8)
    writer.join(60)
    assert not writer.is_alive()
    assert answers[0].status_code == 200
    assert [item["position"] for item in answers[0].json()["items"]] == [11, 12, 13]


def test_no_bound_when_max_lag_is_zero(make: Any) -> None:
    stack = make(FlowLimits(max_lag_events=0, backlog_wait_seconds=0.0))
    for start in range(0, 50, 10):
        assert stack.post(records(start, 10)).status_code == 200
    assert stack.progress.lag() == 50


def test_wait_searchable_answers_once_the_projector_applied_the_batch(make: Any) -> None:
    stack = make(FlowLimits(max_lag_events=0, searchable_wait_seconds=600.0))
    stack.post(records(0, 4))
    writer, answers = start_writer(stack, records(4, 2), wait="searchable")
    assert_still_waiting(writer, answers)
    stack.progress.applied_up_to(5)  # one of its two records: still waiting
    assert_still_waiting(writer, answers)
    stack.progress.applied_up_to(6)
    writer.join(60)
    assert answers[0].status_code == 200
    assert answers[0].json()["searchable"] is True


def test_wait_searchable_that_runs_out_says_so_and_keeps_the_write(make: Any) -> None:
    stack = make(FlowLimits(max_lag_events=0, searchable_wait_seconds=0.0))
    answer = stack.post(records(0, 3), wait="searchable")
    assert answer.status_code == 200
    assert answer.json()["searchable"] is False
    assert answer.json()["accepted"] == 3
    assert stack.store.high_water() == 3


def test_wait_searchable_of_a_batch_with_nothing_accepted_is_a_conflict(make: Any) -> None:
    stack = make(FlowLimits(max_lag_events=0, searchable_wait_seconds=0.0))
    stack.post(records(0, 1))
    stale = stack.post(records(0, 1), wait="searchable")
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "revision_conflict"
    assert "searchable" not in stale.json()["error"]["details"]


def test_wait_searchable_without_a_projector_in_process_is_invalid(make: Any) -> None:
    stack = make(None)
    answer = stack.post(records(0, 1), wait="searchable")
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "invalid_request"
    assert stack.store.high_water() == 0
    assert stack.post(records(0, 1), wait="later").status_code == 422


def test_log_progress_only_grows() -> None:
    progress = LogProgress(written=10, applied=4)
    progress.wrote(8)
    progress.applied_up_to(2)
    assert (progress.written, progress.applied, progress.lag()) == (10, 4, 6)
    progress.applied_up_to(12)
    assert progress.lag() == 0


def test_one_namespaces_backlog_never_holds_another_namespaces_writes(make: Any) -> None:
    """Issue 22: the backlog bound is per namespace. Tenant A is far behind and its
    writer waits for it (holding A's turn); tenant B's writes are admitted at once, and
    B's refusal would name B's own lag, never A's."""
    stack = make(FlowLimits(max_lag_events=5, backlog_wait_seconds=600.0))
    assert stack.post(records(0, 20, "tenant-a")).status_code == 200
    assert (stack.progress.lag("tenant-a"), stack.progress.lag("tenant-b")) == (20, 0)
    waiting: list[httpx.Response] = []
    writer = threading.Thread(target=lambda: waiting.append(stack.post(records(20, 3, "tenant-a"))))
    writer.start()
    writer.join(0.2)
    assert writer.is_alive() and not waiting  # A waits for A's backlog
    for start in (0, 3):  # B's own lag: 0, then 3 (within 5): both admitted at once
        answer = stack.post(records(start, 3, "tenant-b"))
        assert answer.status_code == 200, answer.text
    assert stack.progress.lag("tenant-b") == 6
    assert writer.is_alive() and not waiting
    stack.progress.applied_up_to(stack.store.high_water())  # the projector catches up
    writer.join(60)
    assert waiting[0].status_code == 200


def test_a_refusal_names_the_namespace_and_its_own_lag(make: Any) -> None:
    stack = make(FlowLimits(max_lag_events=2, backlog_wait_seconds=0.0))
    assert stack.post(records(0, 50, "big")).status_code == 200
    assert stack.post(records(0, 3, "small")).status_code == 200
    refused = stack.post(records(3, 1, "small"))
    assert refused.status_code == 503
    details = refused.json()["error"]["details"]
    assert (details["namespace"], details["lag_events"]) == ("small", 3)
    # A batch of both namespaces waits for both; refused here on the first behind.
    both = stack.post(records(10, 1, "big") + records(10, 1, "small"))
    assert both.status_code == 503
    assert both.json()["error"]["details"]["namespace"] == "big"


def test_a_signalled_writer_reads_the_backlog_again_when_told_and_then_writes(make: Any) -> None:
    """Server mode on PostgreSQL: a waiting writer is woken by the projector's
    notifications (`ChangeSignal`), not by a timer."""
    changes = ChangeSignal()
    stack = make(FlowLimits(max_lag_events=5, backlog_wait_seconds=600.0), changes)
    stack.post(records(0, 10))
    writer, answers = start_writer(stack, records(10, 3))
    # Moved only once the writer waits for a change: a writer that read the backlog
    # after the move would rightly write at once (a loaded machine can start it late).
    deadline = time.monotonic() + 60
    while changes.waiting == 0 and writer.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert_still_waiting(writer, answers)
    stack.progress.applied_up_to(8)  # moved, but nobody said so: still waiting
    assert_still_waiting(writer, answers, 0.3)
    assert stack.store.high_water() == 10
    changes.notify()
    writer.join(60)
    assert not writer.is_alive()
    assert answers[0].status_code == 200
    assert [item["position"] for item in answers[0].json()["items"]] == [11, 12, 13]


def test_a_signalled_wait_searchable_answers_when_told_the_batch_is_applied(make: Any) -> None:
    changes = ChangeSignal()
    stack = make(FlowLimits(max_lag_events=0, searchable_wait_seconds=600.0), changes)
    stack.post(records(0, 4))
    writer, answers = start_writer(stack, records(4, 2), wait="searchable")
    assert_still_waiting(writer, answers)
    stack.progress.applied_up_to(5)  # one of its two records
    changes.notify()
    assert_still_waiting(writer, answers)
    stack.progress.applied_up_to(6)
    changes.notify()
    writer.join(60)
    assert answers[0].status_code == 200
    assert answers[0].json()["searchable"] is True


def test_a_change_between_reading_the_version_and_waiting_is_not_lost() -> None:
    changes = ChangeSignal()

    async def scenario() -> list[str]:
        seen: list[str] = []
        version = changes.version
        changes.notify()  # e.g. the projector committed while the backlog was read
        await asyncio.wait_for(changes.changed_since(version, 3_600.0), 60)
        seen.append("returned at once")
        version = changes.version
        waiting = asyncio.create_task(changes.changed_since(version, 3_600.0))
        await asyncio.sleep(0)
        assert not waiting.done()
        threading.Thread(target=changes.notify).start()  # from another thread
        await asyncio.wait_for(waiting, 60)
        seen.append("woken from another thread")
        await changes.changed_since(changes.version, 0.0)  # a timeout ends a wait too
        seen.append("timed out")
        return seen

    assert asyncio.run(scenario()) == [
        "returned at once",
        "woken from another thread",
        "timed out",
    ]
