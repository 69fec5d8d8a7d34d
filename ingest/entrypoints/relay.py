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
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.errors import DependencyUnavailable

__all__ = ["RelayLoop"]

log = logging.getLogger("orrery.relay")


@dataclass(slots=True)
class _Stats:
    steps: int = 0
    published: int = 0
    failures: int = 0
    consecutive_errors: int = 0
    last_error: str | None = None


class RelayLoop:
    """Runs `step` (one `relay_outbox` call returning the number published) until stopped.

    Guarantees:
    - A failing step is retried after a capped exponential backoff
      (`initial_backoff_seconds` doubling up to `max_backoff_seconds`);
      `DependencyUnavailable` is logged as a warning, anything else with its traceback.
      Nothing is skipped: unpublished rows stay in the outbox until a step succeeds.
    - After a step that published something the next one starts at once; after an
      empty one the loop sleeps `poll_seconds`, or less if `wake()` is called (e.g.
      right after a write commits).
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
    ) -> None:
        self._step = step
        self._poll = poll_seconds
        self._initial_backoff = initial_backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stats = _Stats()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Run the loop in a daemon thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="orrery-relay", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "relay": {
                    "running": self._thread is not None and self._thread.is_alive(),
                    "steps": self._stats.steps,
                    "published": self._stats.published,
                    "failures": self._stats.failures,
                    "consecutive_errors": self._stats.consecutive_errors,
                    "last_error": self._stats.last_error,
                }
            }

    def run(self) -> None:
        """Run in the calling thread until `stop()`."""
        while not self._stop.is_set():
            try:
                published = self._step()
            except Exception as exc:
                backoff = self._record_failure(exc)
                if isinstance(exc, DependencyUnavailable):
                    log.warning("relay step failed (%s); retrying in %.2fs", exc, backoff)
                else:
                    log.exception("relay step failed; retrying in %.2fs", backoff)
                self._stop.wait(backoff)
                continue
            with self._lock:
                self._stats.steps += 1
                self._stats.published += published
                self._stats.consecutive_errors = 0
                self._stats.last_error = None
            if published:
                log.debug("published %d outbox events", published)
                continue  # more may be waiting: don't sleep
            self._wake.wait(self._poll)
            self._wake.clear()

    def _record_failure(self, exc: Exception) -> float:
        with self._lock:
            self._stats.steps += 1
            self._stats.failures += 1
            self._stats.consecutive_errors += 1
            self._stats.last_error = f"{type(exc).__name__}: {exc}"
            exponent = min(self._stats.consecutive_errors - 1, 30)
        return float(min(self._max_backoff, self._initial_backoff * 2**exponent))
