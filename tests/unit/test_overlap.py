"""`query.overlap`: a request's second engine call beside its own thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from contracts.errors import ErrorCode, OrreryError
from contracts.timing import engine_call, engine_clock, gil_let_go, gil_let_go_watch
from query.overlap import DeadlinePassed, Pending, SourcePool
from query.service import _start_lexical_first, _Stopwatch

WAIT_S = 30.0  # never reached when the code is right: only bounds a broken run


@pytest.fixture
def pool() -> Iterator[SourcePool]:
    made = SourcePool(workers=1)
    yield made
    made.close()


def _far() -> float:
    return time.perf_counter() + WAIT_S


def test_runs_on_a_pool_thread_and_returns_its_value(pool: SourcePool) -> None:
    started = threading.Event()
    release = threading.Event()

    def call() -> str:
        started.set()
        assert release.wait(WAIT_S)
        return threading.current_thread().name

    pending = pool.start(call)
    # The call runs while the caller does other work: it started before being asked for.
    assert started.wait(WAIT_S)
    release.set()
    name = pending.result(_far())
    assert name.startswith("orrery-source") and name != threading.current_thread().name


def test_the_calls_exception_is_raised_by_result(pool: SourcePool) -> None:
    def call() -> None:
        raise OrreryError(ErrorCode.COVERAGE_UNAVAILABLE, "no index")

    pending = pool.start(call)
    with pytest.raises(OrreryError) as caught:
        pending.result(_far())
    assert caught.value.code is ErrorCode.COVERAGE_UNAVAILABLE


def test_a_busy_pool_hands_the_call_back_to_the_caller(pool: SourcePool) -> None:
    release = threading.Event()
    blocker = pool.start(lambda: release.wait(WAIT_S))
    calls: list[str] = []

    def call() -> str:
        calls.append(threading.current_thread().name)
        return "done"

    queued = pool.start(call)
    # The only pool thread is busy: asking for the result runs the call right here,
    # without waiting for the blocker.
    assert queued.result(_far()) == "done"
    assert calls == [threading.current_thread().name]
    release.set()
    assert blocker.result(_far()) is True
    assert calls == [threading.current_thread().name]  # it ran once, not again on the pool


def _start_blocked(pool: SourcePool) -> tuple[Pending[int], threading.Event]:
    """Start a call on the pool that holds its thread until the returned event is set;
    returns once the call has begun."""
    release = threading.Event()
    entered = threading.Event()

    def call() -> int:
        entered.set()
        release.wait(WAIT_S)
        return 1

    pending = pool.start(call)
    assert entered.wait(WAIT_S)
    return pending, release


def test_result_stops_waiting_at_the_deadline(pool: SourcePool) -> None:
    pending, release = _start_blocked(pool)
    with pytest.raises(DeadlinePassed):
        pending.result(time.perf_counter() + 0.01)
    release.set()


def test_the_engine_clock_counts_calls_on_the_pool(pool: SourcePool) -> None:
    def call() -> None:
        with engine_call("far"):
            time.sleep(0.001)

    with engine_clock() as totals:
        pool.start(call).result(_far())
        with engine_call("near"):
            pass
    assert set(totals) == {"far", "near"} and totals["far"] > 0.0


def test_a_closed_pool_runs_calls_on_the_caller() -> None:
    pool = SourcePool(workers=1)
    pool.close()
    pending = pool.start(lambda: threading.current_thread().name)
    assert pending.result(_far()) == threading.current_thread().name


def test_a_wait_past_the_request_deadline_is_deadline_exceeded(pool: SourcePool) -> None:
    watch = _Stopwatch(timeout_seconds=0.01)
    pending, release = _start_blocked(pool)
    try:
        with pytest.raises(OrreryError) as caught:
            watch.wait(pending, "index_search")
    finally:
        release.set()
    assert caught.value.code is ErrorCode.DEADLINE_EXCEEDED
    assert caught.value.details["stage"] == "index_search"


def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError):
        SourcePool(workers=0)


def test_running_is_true_only_while_the_pool_runs_the_call(pool: SourcePool) -> None:
    pending, release = _start_blocked(pool)
    assert pending.running()
    queued = pool.start(lambda: 2)
    assert not queued.running()  # waiting for the only pool thread
    release.set()
    assert pending.result(_far()) == 1 and not pending.running()
    assert queued.result(_far()) == 2


def test_the_lexical_first_start_returns_once_the_call_lets_the_gil_go(pool: SourcePool) -> None:
    steps: list[str] = []
    release = threading.Event()

    def call() -> int:
        steps.append("prepared")
        gil_let_go()
        steps.append("let go")
        assert release.wait(WAIT_S)
        return 7

    pending = _start_lexical_first(pool, call, wait_s=WAIT_S)
    # The caller went on only after the call had let the GIL go, and before it ended.
    assert steps[0] == "prepared" and pending.running()
    release.set()
    assert pending.result(_far()) == 7


def test_the_lexical_first_start_returns_when_the_call_ends_without_letting_go(
    pool: SourcePool,
) -> None:
    pending = _start_lexical_first(pool, lambda: 3, wait_s=WAIT_S)
    assert pending.result(_far()) == 3


def test_the_lexical_first_start_waits_no_longer_than_told(pool: SourcePool) -> None:
    release = threading.Event()
    pending = _start_lexical_first(pool, lambda: release.wait(WAIT_S), wait_s=0.01)
    assert pending.running()  # never let go, still running: the caller went on anyway
    release.set()
    assert pending.result(_far()) is True


def test_the_lexical_first_start_of_a_busy_pool_hands_the_call_back(pool: SourcePool) -> None:
    blocker, release = _start_blocked(pool)
    pending = _start_lexical_first(pool, threading.get_ident, wait_s=0.01)
    assert pending.result(_far()) == threading.get_ident()
    release.set()
    assert blocker.result(_far()) == 1


def test_gil_let_go_outside_a_watch_does_nothing_and_inside_sets_its_event() -> None:
    gil_let_go()
    with gil_let_go_watch() as let_go:
        assert not let_go.is_set()
        gil_let_go()
        assert let_go.is_set()
    with gil_let_go_watch() as fresh:
        assert not fresh.is_set()
