"""Pacing for background scans that share an interpreter with queries.

A full read-back of a generation (the eligibility gate's periodic evidence check) holds
the GIL for seconds at 100k documents and tens of seconds at 1M; run flat out on a query
worker's background thread it stalls every query that overlaps it. A scan that accepts a
`Pace` calls it between chunks of work (a scroll page, a batch of stored-document
reads); `DutyCycle` sleeps there so that the scan's work takes at most a set share of
the wall time, and the queries run in the gaps. Given the process's `Activity` (the
HTTP requests in flight), it also waits between chunks until no request has run for a
moment (`quiet_seconds`, at most `max_wait_seconds`): a chunk then starts in a gap
between requests, not beside one — beside one, the scan's Python and the request's
take turns at the interpreter, 5 ms a turn (`sys.getswitchinterval`), each time the
request comes back from an engine call. Stdlib only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from itertools import islice
from typing import Any

__all__ = ["Activity", "DutyCycle", "Pace", "no_pace", "release"]

Pace = Callable[[], None]


def no_pace() -> None:
    """Run flat out (a foreground check: an operator or a first query waits for it)."""


# Items freed between two `pace` calls of `release` (a few ms of deallocation).
_RELEASE_CHUNK = 20_000


def release(items: list[Any] | MutableMapping[Any, Any], pace: Pace) -> None:
    """Empty `items` (which the caller owns and no one else reads) `_RELEASE_CHUNK`
    items at a time, `pace` called between chunks. The last references to a million
    pairs dropped in one statement free them in one go: at the end of a 1M eligibility
    check its read-backs and the registry's pairs held the interpreter 70 and 24 ms
    (session 34)."""
    if isinstance(items, list):
        while items:
            del items[-_RELEASE_CHUNK:]
            if items:
                pace()
        return
    while items:
        for key in list(islice(items, _RELEASE_CHUNK)):
            del items[key]
        if items:
            pace()


class Activity:
    """The requests in flight in one process (`running`), for background scans to yield
    to (`wait_quiet`). Thread-safe; entering and leaving take one lock each."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._changed = threading.Condition()
        self._running = 0
        self._started = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._changed:
            self._running += 1
            self._started += 1
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                if not self._running:
                    self._changed.notify_all()

    @property
    def in_flight(self) -> int:
        return self._running

    def wait_quiet(self, quiet_seconds: float, max_wait_seconds: float) -> float:
        """Return once no request ran and none started for `quiet_seconds`, or after
        `max_wait_seconds` whatever the traffic (a scan under steady load still moves);
        the seconds waited."""
        began = self._clock()
        deadline = began + max_wait_seconds
        while True:
            with self._changed:
                while self._running:
                    left = deadline - self._clock()
                    if left <= 0.0:
                        return self._clock() - began
                    self._changed.wait(left)
                started = self._started
            left = deadline - self._clock()
            if left <= 0.0:
                return self._clock() - began
            self._sleep(min(quiet_seconds, left))
            with self._changed:
                if not self._running and self._started == started:
                    return self._clock() - began


class DutyCycle:
    """A `Pace` that sleeps after each chunk for as long as keeps the work at `share`
    of the wall time since the first call: a chunk of `w` seconds is followed by a sleep
    of `w * (1 - share) / share` (at most `max_sleep_seconds`); the first chunk counts
    from construction. With `yield_to`, the next chunk then also waits for a gap between
    requests (`Activity.wait_quiet(quiet_seconds, max_wait_seconds)`; the time it waits
    is `yielded_seconds`, not counted as work). Not thread-safe: one scan, one instance.
    """

    def __init__(
        self,
        share: float,
        *,
        max_sleep_seconds: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        yield_to: Activity | None = None,
        quiet_seconds: float = 0.005,
        max_wait_seconds: float = 0.5,
    ) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], not {share}")
        self._factor = (1.0 - share) / share
        self._max_sleep = max_sleep_seconds
        self._clock = clock
        self._sleep = sleep
        self._yield_to = yield_to
        self._quiet = quiet_seconds
        self._max_wait = max_wait_seconds
        self._since = clock()
        self.slept_seconds = 0.0
        # Seconds spent waiting for a gap between requests (`yield_to`).
        self.yielded_seconds = 0.0

    def __call__(self) -> None:
        now = self._clock()
        pause = min(self._max_sleep, (now - self._since) * self._factor)
        if pause > 0.0:
            self._sleep(pause)
            self.slept_seconds += pause
        if self._yield_to is not None:
            self.yielded_seconds += self._yield_to.wait_quiet(self._quiet, self._max_wait)
        self._since = self._clock()
