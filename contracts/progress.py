"""How far a process's indexes are behind its event log: the positions written and the
positions applied, shared by the embedded write path (ingest writes, the projector
applies) without either importing the other. Stdlib only, no I/O."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

__all__ = ["LogProgress"]


class LogProgress:
    """The newest log position written and the newest one applied, in one process, and
    per namespace the positions written and not yet applied.

    Guarantees: both positions only grow (an older report is ignored); `lag` is never
    negative; reads and updates are safe from any thread. Positions are those of the
    embedded event log (outbox row ids: dense, so `written - applied` is the number of
    events not yet applied). `lag(namespace)` counts the events of that namespace
    reported by `wrote_events` and not yet applied: one tenant's backlog never shows in
    another's.
    """

    __slots__ = ("_applied", "_lock", "_pending", "_written")

    def __init__(self, *, written: int = 0, applied: int = 0) -> None:
        self._lock = threading.Lock()
        self._written = written
        self._applied = applied
        self._pending: dict[str, deque[int]] = {}

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

    def wrote_events(self, events: Iterable[tuple[str, int]]) -> None:
        """These `(namespace, position)` events are committed (positions increasing)."""
        with self._lock:
            for namespace, position in events:
                if position <= self._applied:
                    continue
                self._pending.setdefault(namespace, deque()).append(position)
                if position > self._written:
                    self._written = position

    def applied_up_to(self, position: int) -> None:
        """Events up to `position` are applied to every index (searchable)."""
        with self._lock:
            if position <= self._applied:
                return
            self._applied = position
            for namespace in list(self._pending):
                pending = self._pending[namespace]
                while pending and pending[0] <= position:
                    pending.popleft()
                if not pending:
                    del self._pending[namespace]

    def lag(self, namespace: str | None = None) -> int:
        """Events written and not yet applied: all of them, or one namespace's."""
        with self._lock:
            if namespace is None:
                return max(0, self._written - self._applied)
            pending = self._pending.get(namespace)
            return 0 if pending is None else len(pending)
