"""How far a process's indexes are behind its event log: the positions written and the
positions applied, shared by the embedded write path (ingest writes, the projector
applies) without either importing the other. Stdlib only, no I/O."""

from __future__ import annotations

import threading

__all__ = ["LogProgress"]


class LogProgress:
    """The newest log position written and the newest one applied, in one process.

    Guarantees: both only grow (an older report is ignored); `lag` is never negative;
    reads and updates are safe from any thread. Positions are those of the embedded event
    log (outbox row ids: dense, so `written - applied` is the number of events not yet
    applied).
    """

    __slots__ = ("_applied", "_lock", "_written")

    def __init__(self, *, written: int = 0, applied: int = 0) -> None:
        self._lock = threading.Lock()
        self._written = written
        self._applied = applied

    @property
    def written(self) -> int:
        return self._written

    @property
    def applied(self) -> int:
        return self._applied

    def wrote(self, position: int) -> None:
        """Events up to `position` are committed to the log."""
        with self._lock:
            if position > self._written:
                self._written = position

    def applied_up_to(self, position: int) -> None:
        """Events up to `position` are applied to every index (searchable)."""
        with self._lock:
            if position > self._applied:
                self._applied = position

    def lag(self) -> int:
        """Events written and not yet applied."""
        with self._lock:
            return max(0, self._written - self._applied)
