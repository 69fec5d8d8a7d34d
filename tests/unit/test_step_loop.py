"""`contracts.step_loop.StepLoop`: a failure that repeats is one report per window."""

from __future__ import annotations

import threading

from contracts.errors import DependencyUnavailable
from contracts.step_loop import StepLoop


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Loop(StepLoop[int]):
    def __init__(self, outcomes: list[Exception | int], clock: _Clock) -> None:
        self.outcomes = outcomes
        self.clock = clock
        self.reports: list[tuple[str, int]] = []
        self.recoveries: list[int] = []
        super().__init__(
            self._next,
            thread_name="test-loop",
            poll_seconds=0.0,
            initial_backoff_seconds=0.0,
            max_backoff_seconds=0.0,
            report_window_seconds=60.0,
            clock=clock,
        )

    def _next(self) -> int:
        outcome = self.outcomes.pop(0)
        self.clock.now += 10.0  # every attempt takes 10 s of the fake clock
        if not self.outcomes:
            self._stop.set()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _record_success(self, result: int) -> bool:
        return True

    def _report_failure(self, exc: Exception, backoff: float, *, repeated: int) -> None:
        self.reports.append((str(exc), repeated))

    def _report_recovery(self, failures: int) -> None:
        self.recoveries.append(failures)


def test_a_repeated_failure_is_reported_once_per_window_with_its_count() -> None:
    down = DependencyUnavailable("kafka", "no bootstrap server reachable")
    other = DependencyUnavailable("kafka", "topic missing")
    # 14 identical failures 10 s apart, another message, then a success.
    loop = _Loop([*([down] * 14), other, 1, 1], _Clock())
    runner = threading.Thread(target=loop.run)
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive()
    messages = [message for message, _ in loop.reports]
    # At 10 s (first), 70 s (window passed: 5 unreported since), 130 s (5 more); the
    # new message is reported at once, with nothing of its own unreported.
    assert messages == [str(down), str(down), str(down), str(other)]
    assert [repeated for _, repeated in loop.reports] == [0, 5, 5, 0]
    assert loop.recoveries == [15]
