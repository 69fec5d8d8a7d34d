"""The projector loop: apply the log continuously, wake early on a commit signal."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from projector.service import BatchReport

__all__ = ["ProjectorLoop"]

log = logging.getLogger("orrery.projector")


@dataclass(slots=True)
class _Stats:
    batches: int = 0
    events: int = 0
    position: int = 0
    last_error: str | None = None
    consecutive_errors: int = 0
    lag: int | None = None
    parked: int = 0


class ProjectorLoop:
    """Runs `step` in a thread until stopped.

    Guarantees: an error in `step` is logged and retried with capped exponential backoff
    (nothing is skipped: the position only moves when a batch commits); `wake()` makes
    the next step start at once; `stop()` returns after the current batch finished.
    `status()` reports the last measured log lag (`lag_events`, None before the first
    measurement) and how many undecodable events this process parked.
    """

    def __init__(
        self,
        step: Callable[[], BatchReport],
        *,
        poll_seconds: float = 0.05,
        max_backoff_seconds: float = 5.0,
    ) -> None:
        self._step = step
        self._poll = poll_seconds
        self._max_backoff = max_backoff_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stats = _Stats()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="orrery-projector", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "projector": {
                    "running": self._thread is not None and self._thread.is_alive(),
                    "batches": self._stats.batches,
                    "events": self._stats.events,
                    "position": self._stats.position,
                    "lag_events": self._stats.lag,
                    "dead_letters_parked": self._stats.parked,
                    "last_error": self._stats.last_error,
                }
            }

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                report = self._step()
            except Exception as exc:
                with self._lock:
                    self._stats.consecutive_errors += 1
                    self._stats.last_error = f"{type(exc).__name__}: {exc}"
                    backoff = min(
                        self._max_backoff, 0.1 * 2 ** (self._stats.consecutive_errors - 1)
                    )
                log.exception("projector batch failed; retrying in %.2fs", backoff)
                self._stop.wait(backoff)
                continue
            with self._lock:
                self._stats.consecutive_errors = 0
                self._stats.last_error = None
                self._stats.position = report.position
                self._stats.parked += report.parked
                if report.lag is not None:
                    self._stats.lag = report.lag
                if report.events:
                    self._stats.batches += 1
                    self._stats.events += report.events
            if report.events:
                log.debug(
                    "applied %d events (%d upserts, %d deletes, %d embedded) in %.3fs",
                    report.events,
                    report.upserts,
                    report.deletes,
                    report.embedded,
                    report.seconds,
                )
                continue  # more may be waiting: don't sleep
            self._wake.wait(self._poll)
            self._wake.clear()
