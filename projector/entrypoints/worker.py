"""The projector loop: apply the log continuously, wake early on a commit signal."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.errors import OrreryError
from contracts.step_loop import StepLoop
from projector.service import BatchReport

__all__ = ["ProjectorLoop"]

log = logging.getLogger("orrery.projector")

# The first retry after a failed batch; it doubles per consecutive failure.
_INITIAL_BACKOFF_SECONDS = 0.1


@dataclass(slots=True)
class _Stats:
    batches: int = 0
    events: int = 0
    position: int = 0
    lag: int | None = None
    parked: int = 0


class ProjectorLoop(StepLoop[BatchReport]):
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
        super().__init__(
            step,
            thread_name="orrery-projector",
            poll_seconds=poll_seconds,
            initial_backoff_seconds=_INITIAL_BACKOFF_SECONDS,
            max_backoff_seconds=max_backoff_seconds,
        )
        self._stats = _Stats()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "projector": {
                    "running": self._running(),
                    "batches": self._stats.batches,
                    "events": self._stats.events,
                    "position": self._stats.position,
                    "lag_events": self._stats.lag,
                    "dead_letters_parked": self._stats.parked,
                    "last_error": self._last_error,
                }
            }

    def _record_success(self, result: BatchReport) -> bool:
        self._stats.position = result.position
        self._stats.parked += result.parked + result.dead_lettered
        if result.lag is not None:
            self._stats.lag = result.lag
        if result.events:
            self._stats.batches += 1
            self._stats.events += result.events
            log.debug(
                "applied %d events (%d upserts, %d deletes, %d embedded) in %.3fs",
                result.events,
                result.upserts,
                result.deletes,
                result.embedded,
                result.seconds,
            )
        return result.events > 0

    def _report_failure(self, exc: Exception, backoff: float, *, repeated: int) -> None:
        since = f" ({repeated} more attempts failed the same way)" if repeated else ""
        if isinstance(exc, OrreryError):
            # An expected fault (a dependency down, …): one line; the traceback at DEBUG.
            log.warning(
                "projector batch failed: %s; retrying in %.2fs%s",
                exc.message,
                backoff,
                since,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        else:
            log.exception("projector batch failed; retrying in %.2fs%s", backoff, since)

    def _report_recovery(self, failures: int) -> None:
        log.warning("projector recovered after %d failed batches", failures)
