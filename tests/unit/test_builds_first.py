"""The background lexical compactor's pause for HNSW builds (`projector.bootstrap.
_BuildsFirst`): it waits while a build runs, never longer than its budget, and a stop
ends the wait."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from projector.bootstrap import BUILD_FIRST_MAX_WAIT_S, _BuildsFirst


def _answers(*values: bool) -> tuple[Callable[[], bool], list[bool]]:
    """A `building` that says `values` in turn, then False; and what it said."""
    said: list[bool] = []
    it: Iterator[bool] = iter(values)

    def building() -> bool:
        value = next(it, False)
        said.append(value)
        return value

    return building, said


def test_no_build_no_wait() -> None:
    building, said = _answers()
    builds = _BuildsFirst(building, threading.Event(), poll_s=0.001)
    builds.wait()
    assert said == [False]
    assert builds.waited_s == 0.0


def test_it_waits_while_a_build_runs_and_goes_on_once_it_ended() -> None:
    building, said = _answers(True, True, True)
    builds = _BuildsFirst(building, threading.Event(), poll_s=0.001)
    builds.wait()
    assert said == [True, True, True, False]
    assert builds.waited_s == pytest.approx(0.003)


def test_the_budget_bounds_every_wait_of_its_life() -> None:
    builds = _BuildsFirst(lambda: True, threading.Event(), max_wait_s=0.005, poll_s=0.002)
    builds.wait()
    assert builds.waited_s == pytest.approx(0.005)  # 0.002 + 0.002 + the 0.001 left
    builds.wait()  # a build that never ends: no more waiting
    assert builds.waited_s == pytest.approx(0.005)


def test_a_stop_ends_the_wait() -> None:
    stop = threading.Event()
    asked = threading.Event()

    def building() -> bool:
        asked.set()
        return True

    builds = _BuildsFirst(building, stop, poll_s=0.01)
    waiter = threading.Thread(target=builds.wait)
    waiter.start()
    assert asked.wait(10.0)
    stop.set()
    waiter.join(10.0)
    assert not waiter.is_alive()
    assert builds.waited_s < BUILD_FIRST_MAX_WAIT_S
