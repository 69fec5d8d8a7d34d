"""The loop of a background worker: one step after another in a thread until stopped.

The relay (`ingest.entrypoints.relay`) and the projector (`projector.entrypoints.worker`)
run the same loop around different steps; they may share code only through `contracts`,
so this is stdlib only and does no I/O of its own (subclasses log).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["StepLoop"]

Result = TypeVar("Result")

# Past this many consecutive failures the backoff stops doubling (it is capped long
# before; the bound keeps `2 ** n` a float).
_MAX_DOUBLINGS = 30
# A failure that repeats (the same message) is reported once per this window, with the
# count of the attempts since: a broker that is down for an hour is 60 lines, not 720
# tracebacks.
REPORT_WINDOW_SECONDS = 60.0


class StepLoop(Generic[Result]):
    """Runs `step` again and again until `stop()`.

    Guarantees:
    - A step that raises is retried after a capped exponential backoff
      (`initial_backoff_seconds` doubling per consecutive failure, up to
      `max_backoff_seconds`); `wake()` does not cut a backoff short, `stop()` does.
    - After a step that did work (`_record_success` returns True) the next one starts at
      once; after an idle one the loop sleeps `poll_seconds`, or less if `wake()` is
      called (e.g. right after a write commits).
    - `stop()` interrupts a backoff or an idle wait at once and returns after the step
      in progress, if any, finished (or after `timeout`).
    - With `min_interval_seconds`, a step after an idle one starts no sooner than that
      long after the idle one started, even when woken earlier: wakes that come faster
      than that are taken together, by one step (a busy step is followed at once).

    - A failure is reported (`_report_failure`) when its message differs from the last
      one reported, or once per `report_window_seconds` while it repeats, with the
      number of failed attempts since the last report; the first success after
      failures is reported once (`_report_recovery`).

    Subclasses count results in `_record_success` and failures in `_record_failure`
    (both called with `_lock` held, as `status()` should read under it), and log a
    failure in `_report_failure` and a recovery in `_report_recovery` (lock not held).
    """

    def __init__(
        self,
        step: Callable[[], Result],
        *,
        thread_name: str,
        poll_seconds: float,
        initial_backoff_seconds: float,
        max_backoff_seconds: float,
        report_window_seconds: float = REPORT_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        min_interval_seconds: float = 0.0,
    ) -> None:
        self._step = step
        self._min_interval = min_interval_seconds
        self._report_window = report_window_seconds
        self._clock = clock
        self._reported: tuple[str, float] | None = None  # (message, when) of the last report
        self._unreported = 0  # failed attempts since the last report
        self._failures_in_a_row = 0
        self._thread_name = thread_name
        self._poll = poll_seconds
        self._initial_backoff = initial_backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._consecutive_errors = 0
        self._last_error: str | None = None

    def start(self) -> None:
        """Run the loop in a daemon thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=self._thread_name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def run(self) -> None:
        """Run in the calling thread until `stop()`."""
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                result = self._step()
            except Exception as exc:
                with self._lock:
                    self._consecutive_errors += 1
                    self._last_error = f"{type(exc).__name__}: {exc}"
                    self._record_failure(exc)
                    doublings = min(self._consecutive_errors - 1, _MAX_DOUBLINGS)
                backoff = float(min(self._max_backoff, self._initial_backoff * 2**doublings))
                self._maybe_report(exc, backoff)
                self._stop.wait(backoff)
                continue
            with self._lock:
                self._consecutive_errors = 0
                self._last_error = None
                busy = self._record_success(result)
            if self._failures_in_a_row:
                failures, self._failures_in_a_row = self._failures_in_a_row, 0
                self._reported, self._unreported = None, 0
                self._report_recovery(failures)
            if busy:
                continue  # more may be waiting: don't sleep
            self._wake.wait(self._poll)
            self._wake.clear()
            rest = started + self._min_interval - time.monotonic()
            if rest > 0:
                self._stop.wait(rest)

    def _maybe_report(self, exc: Exception, backoff: float) -> None:
        self._failures_in_a_row += 1
        message = f"{type(exc).__name__}: {exc}"
        now = self._clock()
        last = self._reported
        if last is not None and last[0] == message and now - last[1] < self._report_window:
            self._unreported += 1
            return
        # The attempts not reported failed like the last report; a new message has none.
        repeated = self._unreported if last is not None and last[0] == message else 0
        self._unreported = 0
        self._reported = (message, now)
        self._report_failure(exc, backoff, repeated=repeated)

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _record_success(self, result: Result) -> bool:
        """Count a step's result (lock held); True if more work may be waiting."""
        raise NotImplementedError

    def _record_failure(self, exc: Exception) -> None:
        """Count a failed step (lock held)."""

    def _report_failure(self, exc: Exception, backoff: float, *, repeated: int) -> None:
        """Log a failed step before the backoff (lock not held); `repeated` attempts
        failed the same way since the last report and were not reported."""
        raise NotImplementedError

    def _report_recovery(self, failures: int) -> None:
        """Log the first success after `failures` failed attempts in a row."""
