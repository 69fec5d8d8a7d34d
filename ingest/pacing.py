"""How the write routes pace writers against the projector, per namespace.

Every route that writes records (`POST /v1/records`, ChonkyDB's bulk write, KoutenDB's
import) takes its batches through one `WritePacer` per process. A batch is written only
while each namespace it writes is at most `FlowLimits.max_lag_events` events behind
(that namespace's events committed and not yet applied, `ProjectionProgress.lag(ns)`),
and writers of one namespace are admitted one at a time. A namespace further behind
waits, up to `backlog_wait_seconds`, then gets `503 ingest_backlog` (Retry-After) with
nothing written. One tenant's burst therefore slows that tenant only: another
namespace's writers are neither queued behind its lock nor measured by its backlog
(issue 22: a 20,000-line import once made every tenant's writes answer 503 for ~126 s).

The bound is per namespace, so the log holds at most `max_lag_events + max_batch`
unapplied events per writing namespace; another namespace's acknowledged write waits
behind at most that much per active namespace to become searchable.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from contracts.errors import ErrorCode, OrreryError
from ingest.model import FlowLimits
from ingest.ports import ProjectionProgress

__all__ = ["WAIT_POLL_SECONDS", "ChangeSignal", "IngestBacklog", "WriteFlow", "WritePacer"]

# How often a waiting writer looks at the projector's progress (an int read): the most a
# wait adds to the moment the answer could have left.
WAIT_POLL_SECONDS = 0.002


class ChangeSignal:
    """Tells waiting writers that the projector's progress may have moved (`notify`, from
    any thread: e.g. a database listener's), so that they read their backlog again then
    instead of on a timer.

    Guarantees: `version` increases with every `notify`; `changed_since(seen, timeout)`
    returns once `version` differs from `seen` (at once if it does already) or after
    `timeout` seconds, whichever comes first. A notify is never lost between a writer's
    read of `version` and its wait: read `version` before the backlog, wait with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    @property
    def version(self) -> int:
        return self._version

    @property
    def waiting(self) -> int:
        """How many `changed_since` calls wait now."""
        with self._lock:
            return len(self._waiters)

    def notify(self) -> None:
        with self._lock:
            self._version += 1
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(event.set)

    async def changed_since(self, seen: int, timeout: float) -> None:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            if self._version != seen:
                return
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter[1].wait(), max(0.0, timeout))
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(waiter)


@dataclass(frozen=True, slots=True)
class WriteFlow:
    """The projector's progress and the limits a write is paced by: in memory in the
    embedded deployment (`contracts.progress.LogProgress`), read from the database in
    server mode on PostgreSQL (`ingest.adapters.postgres_backlog`: `blocking`, so read
    off the event loop, and polled every `poll_seconds`, not every few ms). With
    `changes`, a waiting writer reads its backlog again when told the progress moved
    (PostgreSQL: the projector's notifications), and every `poll_seconds` at most
    apart as a safety net."""

    progress: ProjectionProgress
    limits: FlowLimits
    poll_seconds: float = WAIT_POLL_SECONDS
    blocking: bool = False
    changes: ChangeSignal | None = None


class IngestBacklog(OrreryError):
    """`503 ingest_backlog`: a namespace stayed too far behind; nothing was written.
    `headers` go out with the answer (`Retry-After`)."""

    def __init__(self, namespace: str, lag: int, limit: int, waited: float) -> None:
        super().__init__(
            ErrorCode.INGEST_BACKLOG,
            f"the indexes are {lag} events behind in namespace {namespace!r} (at most "
            f"{limit} before a write); nothing was written: retry later",
            {
                "namespace": namespace,
                "lag_events": lag,
                "max_lag_events": limit,
                "waited_seconds": waited,
            },
        )
        self.headers = {"Retry-After": "1"}


class WritePacer:
    """Admits writers per namespace (see the module docstring). Without a `flow` (a
    process that does not run the projector) every writer is admitted at once.

    Guarantees: while admitted, a writer holds every namespace of its batch alone (taken
    in name order, so two batches never wait for each other crosswise), and each was at
    most `max_lag_events` behind when admitted; a refused writer holds nothing."""

    def __init__(self, flow: WriteFlow | None) -> None:
        self.flow = flow
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @asynccontextmanager
    async def admitted(
        self, namespaces: Iterable[str], *, deadline: float | None = None
    ) -> AsyncIterator[None]:
        """Hold the batch's namespaces while the body writes; `IngestBacklog` when one
        stayed too far behind until `deadline` (monotonic; default: now plus
        `backlog_wait_seconds`)."""
        if self.flow is None:
            yield
            return
        limits = self.flow.limits
        if deadline is None:
            deadline = time.monotonic() + limits.backlog_wait_seconds
        held: list[str] = []
        try:
            for namespace in sorted(set(namespaces)):
                await self._take(namespace, deadline)
                held.append(namespace)
                await self._caught_up(namespace, deadline)
            yield
        finally:
            for namespace in held:
                self._release(namespace)

    async def _take(self, namespace: str, deadline: float) -> None:
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        self._users[namespace] = self._users.get(namespace, 0) + 1
        if not lock.locked():  # taken at once (no await in between)
            await lock.acquire()
            return
        try:
            await asyncio.wait_for(lock.acquire(), timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            self._forget(namespace)
            raise self._backlog(namespace, await self._lag(namespace)) from None

    async def _caught_up(self, namespace: str, deadline: float) -> None:
        assert self.flow is not None
        limit = self.flow.limits.max_lag_events
        if not limit:
            return
        changes = self.flow.changes
        while True:
            # Read before the backlog: a change after this read ends the wait below.
            seen = changes.version if changes is not None else 0
            lag = await self._lag(namespace)
            if lag <= limit:
                return
            now = time.monotonic()
            if now >= deadline:
                raise self._backlog(namespace, lag)
            if changes is None:
                await asyncio.sleep(self.flow.poll_seconds)
            else:
                await changes.changed_since(seen, min(self.flow.poll_seconds, deadline - now))

    async def _lag(self, namespace: str) -> int:
        assert self.flow is not None
        if self.flow.blocking:
            return await asyncio.to_thread(self.flow.progress.lag, namespace)
        return self.flow.progress.lag(namespace)

    def _release(self, namespace: str) -> None:
        self._locks[namespace].release()
        self._forget(namespace)

    def _forget(self, namespace: str) -> None:
        self._users[namespace] -= 1
        if self._users[namespace] == 0:
            del self._users[namespace], self._locks[namespace]

    def _backlog(self, namespace: str, lag: int) -> IngestBacklog:
        assert self.flow is not None
        limits = self.flow.limits
        return IngestBacklog(
            namespace,
            lag,
            limits.max_lag_events,
            limits.backlog_wait_seconds,
        )
