"""Pacing for background scans that share an interpreter with queries.

A full read-back of a generation (the eligibility gate's periodic evidence check) holds
the GIL for seconds at 100k documents and tens of seconds at 1M; run flat out on a query
worker's background thread it stalls every query that overlaps it. A scan that accepts a
`Pace` calls it between chunks of work (a scroll page, a batch of stored-document
reads); `DutyCycle` sleeps there so that the scan's work takes at most a set share of
the wall time, and the queries run in the gaps. Stdlib only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["DutyCycle", "Pace", "no_pace"]

Pace = Callable[[], None]


def no_pace() -> None:
    """Run flat out (a foreground check: an operator or a first query waits for it)."""


class DutyCycle:
    """A `Pace` that sleeps after each chunk for as long as keeps the work at `share`
    of the wall time since the first call: a chunk of `w` seconds is followed by a sleep
    of `w * (1 - share) / share` (at most `max_sleep_seconds`); the first chunk counts
    from construction. Not thread-safe: one scan, one instance."""

    def __init__(
        self,
        share: float,
        *,
        max_sleep_seconds: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], not {share}")
        self._factor = (1.0 - share) / share
        self._max_sleep = max_sleep_seconds
        self._clock = clock
        self._sleep = sleep
        self._since = clock()
        self.slept_seconds = 0.0

    def __call__(self) -> None:
        now = self._clock()
        pause = min(self._max_sleep, (now - self._since) * self._factor)
        if pause > 0.0:
            self._sleep(pause)
            self.slept_seconds += pause
        self._since = self._clock()
