"""`orrery serve` says "serving" when what it loaded is searchable, not when it binds.

`Announcer` polls the process's own readiness (the body of `GET /v1/readiness`, read
in-process) on a thread and calls `announce(seconds)` once: when readiness is `ready`
and every wanted `(namespace, snapshot_kind)` — the sample corpus's scopes — has a live
generation. Meanwhile it prints a progress line after `hint_seconds`, then once a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Announcer", "searchable"]

log = logging.getLogger("orrery")


def searchable(body: dict[str, Any], wanted: Iterable[tuple[str, str]]) -> bool:
    """Whether a readiness `body` is ready and holds every wanted scope."""
    have = {(s["namespace"], s["snapshot_kind"]) for s in body.get("scopes", [])}
    return bool(body.get("ready")) and set(wanted) <= have


def _waiting_for(body: dict[str, Any], wanted: set[tuple[str, str]]) -> str:
    have = {(s["namespace"], s["snapshot_kind"]) for s in body.get("scopes", [])}
    missing = sorted(f"{ns}/{kind}" for ns, kind in wanted - have)
    lag = sum(int(s.get("lag_events", 0)) for s in body.get("scopes", []))
    parts = []
    if missing:
        parts.append(f"first generation of {', '.join(missing)}")
    if lag:
        parts.append(f"{lag} events to apply")
    not_eligible = [
        s["generation_id"] for s in body.get("scopes", []) if not s.get("eligible", True)
    ]
    if not_eligible:
        parts.append(f"eligibility of {', '.join(not_eligible)}")
    return "; ".join(parts) or "the projector's log position"


class Announcer:
    """Calls `announce(seconds since began)` once what was loaded is searchable."""

    def __init__(
        self,
        readiness: Callable[[], dict[str, Any]] | None,
        wanted: Iterable[tuple[str, str]],
        *,
        began: float,
        announce: Callable[[float], None],
        progress: Callable[[str], None] | None = None,
        poll_seconds: float = 0.2,
        hint_seconds: float = 15.0,
    ) -> None:
        self._readiness = readiness
        self._wanted = set(wanted)
        self._began = began
        self._announce = announce
        self._progress = progress or (lambda line: log.info("%s", line))
        self._poll = poll_seconds
        self._hint = hint_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orrery-announce", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        if self._readiness is None:  # a process without the query role: nothing to wait on
            self._announce(time.monotonic() - self._began)
            return
        next_hint = time.monotonic() + self._hint
        while not self._stop.is_set():
            try:
                body = self._readiness()
            except Exception as exc:  # a dependency still down: readiness says so later
                log.debug("readiness not available yet: %s", exc)
                body = {}
            if searchable(body, self._wanted):
                self._announce(time.monotonic() - self._began)
                return
            now = time.monotonic()
            if now >= next_hint:
                self._progress(
                    f"not searchable yet after {now - self._began:.0f} s: waiting for "
                    f"{_waiting_for(body, self._wanted)}"
                )
                # The first hint early, later ones once a minute (a long wait is a few lines).
                next_hint = now + max(self._hint, 60.0)
            self._stop.wait(self._poll)
