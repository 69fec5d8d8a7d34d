"""`contracts.pacing.DutyCycle`: the sleeps that keep a background scan at its share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.pacing import DutyCycle, no_pace


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
