"""The relay loop: publish the outbox continuously (the future `orrery relay` command).

Wiring is the composition root's job, e.g.::

    step = functools.partial(
        relay_outbox,
        source=SqliteOutboxReader(db_path),
        publisher=KafkaEventPublisher(KafkaPublisherSettings(bootstrap)),
        batch_size=500,
        max_batches=20,
    )
    RelayLoop(step).run()  # until stop(), e.g. from a signal handler
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.errors import DependencyUnavailable
from contracts.step_loop import StepLoop

__all__ = ["RelayLoop"]

log = logging.getLogger("orrery.relay")


@dataclass(slots=True)
class _Stats:
    steps: int = 0
    published: int = 0
    failures: int = 0


class RelayLoop(StepLoop[int]):
    """Runs `step` (one `relay_outbox` call returning the number published) until stopped.

    Guarantees:
    - A failing step is retried after a capped exponential backoff
      (`initial_backoff_seconds` doubling up to `max_backoff_seconds`);
      `DependencyUnavailable` is logged as a warning, anything else with its traceback.
      Nothing is skipped: unpublished rows stay in the outbox until a step succeeds.
    - After a step that published something the next one starts at once (with
      `drained_below`: only after one that published at least that many, i.e. may have
      left rows behind); otherwise the loop sleeps `poll_seconds`, or less if `wake()`
      is called (e.g. right after a write commits), but with `min_interval_seconds` no
      less than that since the previous step started: commits that come faster are
      claimed together, in one step's batches.
    - `stop()` interrupts a backoff or an idle wait at once and returns after the step
      in progress, if any, finished (bounded by the publisher's own timeouts).
    """

    def __init__(
        self,
        step: Callable[[], int],
        *,
        poll_seconds: float = 0.5,
        initial_backoff_seconds: float = 0.2,
        max_backoff_seconds: float = 30.0,
        min_interval_seconds: float = 0.0,
        drained_below: int | None = None,
    ) -> None:
        super().__init__(
            step,
            thread_name="orrery-relay",
            poll_seconds=poll_seconds,
            initial_backoff_seconds=initial_backoff_seconds,
            max_backoff_seconds=max_backoff_seconds,
            min_interval_seconds=min_interval_seconds,
        )
        self._stats = _Stats()
        self._drained_below = drained_below

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "relay": {
                    "running": self._running(),
                    "steps": self._stats.steps,
                    "published": self._stats.published,
                    "failures": self._stats.failures,
                    "consecutive_errors": self._consecutive_errors,
                    "last_error": self._last_error,
                }
            }

    def _record_success(self, result: int) -> bool:
        self._stats.steps += 1
        self._stats.published += result
        if result:
            log.debug("published %d outbox events", result)
        if self._drained_below is not None:
            return result >= self._drained_below
        return result > 0

    def _record_failure(self, exc: Exception) -> None:
        self._stats.steps += 1
        self._stats.failures += 1

    def _report_failure(self, exc: Exception, backoff: float, *, repeated: int) -> None:
        since = f" ({repeated} more attempts failed the same way)" if repeated else ""
        if isinstance(exc, DependencyUnavailable):
            log.warning(
                "relay step failed (%s); retrying in %.2fs%s",
                exc,
                backoff,
                since,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        else:
            log.exception("relay step failed; retrying in %.2fs%s", backoff, since)

    def _report_recovery(self, failures: int) -> None:
        log.warning("relay recovered after %d failed steps", failures)
