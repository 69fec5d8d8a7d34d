"""`contracts.pacing`: the sleeps that keep a background scan at its share (`DutyCycle`)
and the gaps between requests it waits for (`Activity`)."""

from __future__ import annotations

import threading
import time as real_time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import pacing
from contracts.pacing import Activity, DutyCycle, no_pace, release


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_each_chunk_is_followed_by_the_sleep_that_keeps_the_share() -> None:
    time = FakeTime()
    pace = DutyCycle(0.25, clock=time.clock, sleep=time.sleep)
    time.now += 0.1  # a chunk of work since construction
    pace()
    time.now += 0.02
    pace()
    assert time.sleeps == pytest.approx([0.3, 0.06])
    assert pace.slept_seconds == pytest.approx(0.36)


def test_a_long_chunk_sleeps_at_most_the_cap() -> None:
    time = FakeTime()
    pace = DutyCycle(0.1, max_sleep_seconds=0.5, clock=time.clock, sleep=time.sleep)
    time.now += 2.0
    pace()
    assert time.sleeps == [0.5]


def test_the_full_share_never_sleeps_and_no_pace_does_nothing() -> None:
    time = FakeTime()
    pace = DutyCycle(1.0, clock=time.clock, sleep=time.sleep)
    time.now += 1.0
    pace()
    no_pace()
    assert time.sleeps == []


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_0_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError):
        DutyCycle(share)


@given(
    share=st.floats(min_value=0.05, max_value=1.0),
    chunks=st.lists(st.floats(min_value=0.0, max_value=0.05), min_size=1, max_size=30),
)
def test_work_never_exceeds_its_share_of_the_wall_time(share: float, chunks: list[float]) -> None:
    time = FakeTime()
    start = time.now
    pace = DutyCycle(share, max_sleep_seconds=10.0, clock=time.clock, sleep=time.sleep)
    for chunk in chunks:
        time.now += chunk
        pace()
    wall = time.now - start
    assert sum(chunks) <= share * wall + 1e-9


def test_an_idle_process_is_quiet_after_one_quiet_period() -> None:
    time = FakeTime()
    activity = Activity(clock=time.clock, sleep=time.sleep)
    assert activity.wait_quiet(0.01, 1.0) == pytest.approx(0.01)
    assert activity.in_flight == 0


def test_a_request_that_starts_during_the_quiet_period_restarts_it() -> None:
    time = FakeTime()

    def sleep(seconds: float) -> None:
        if not time.sleeps:  # a short request comes and goes in the first quiet period
            with activity.running():
                assert activity.in_flight == 1
        time.sleep(seconds)

    activity = Activity(clock=time.clock, sleep=sleep)
    assert activity.wait_quiet(0.01, 1.0) == pytest.approx(0.02)
    assert time.sleeps == pytest.approx([0.01, 0.01])


def test_a_scan_waits_for_the_request_in_flight_to_end() -> None:
    activity = Activity()
    entered, leave = threading.Event(), threading.Event()

    def request() -> None:
        with activity.running():
            entered.set()
            leave.wait(30)

    worker = threading.Thread(target=request)
    worker.start()
    try:
        assert entered.wait(30)
        threading.Timer(0.05, leave.set).start()
        waited = activity.wait_quiet(0.005, 30.0)
        # Returned before its bound: only once nothing was in flight (and 5 ms after).
        assert waited < 30.0 and leave.is_set() and activity.in_flight == 0
    finally:
        leave.set()
        worker.join(30)


def test_a_scan_under_steady_load_still_moves_after_its_longest_wait() -> None:
    activity = Activity()
    with activity.running():
        started = real_time.monotonic()
        waited = activity.wait_quiet(0.005, 0.1)
        assert activity.in_flight == 1
    assert 0.1 <= waited <= real_time.monotonic() - started


def test_a_duty_cycle_yields_to_requests_after_its_sleep_and_counts_it_apart() -> None:
    time = FakeTime()
    activity = Activity(clock=time.clock, sleep=time.sleep)
    pace = DutyCycle(0.5, clock=time.clock, sleep=time.sleep, yield_to=activity, quiet_seconds=0.01)
    time.now += 0.1
    pace()
    assert time.sleeps == pytest.approx([0.1, 0.01])  # its share's sleep, then the quiet
    assert pace.slept_seconds == pytest.approx(0.1)
    assert pace.yielded_seconds == pytest.approx(0.01)


@given(size=st.integers(0, 70_000), as_dict=st.booleans())
def test_release_empties_in_chunks_with_a_pace_between_each(size: int, as_dict: bool) -> None:
    """Whatever is released ends empty, freed at most `_RELEASE_CHUNK` items between two
    `pace` calls and never paced after the last chunk."""
    items: list[int] | dict[int, int] = (
        dict.fromkeys(range(size), 0) if as_dict else list(range(size))
    )
    freed_between: list[int] = []
    last = [size]

    def pace() -> None:
        freed_between.append(last[0] - len(items))
        last[0] = len(items)

    release(items, pace)
    assert len(items) == 0
    chunk = pacing._RELEASE_CHUNK
    assert len(freed_between) == max(0, -(-size // chunk) - 1)
    assert all(n == chunk for n in freed_between)
