"""Two engine calls of one request at once: one on a small shared pool, one on the
request's own thread.

The lexical and the vector source of a query do not depend on each other (nor do the
two id-restricted score lookups of the re-score), and each waits on an engine: an HTTP
round trip in server mode (OpenSearch, Qdrant), a native search in embedded mode. Run
side by side, a stage costs the slower call instead of both. Threads suffice: the
drivers release the GIL while they wait.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Generic, TypeVar

__all__ = ["DeadlinePassed", "Pending", "SourcePool", "shared_source_pool"]

T = TypeVar("T")

DEFAULT_WORKERS = 4


class DeadlinePassed(Exception):
    """`Pending.result` waited until its deadline and the call had not finished."""


class Pending(Generic[T]):
    """One call started beside the caller (`SourcePool.start`).

    Guarantees: `result` returns the call's value or raises its exception, exactly once
    per call; a call the pool has not started by then (every pool thread busy) is taken
    back and run on the caller's thread, so a busy pool never makes a request slower
    than running its calls one after the other; `result` waits no later than the
    deadline, then raises `DeadlinePassed` (the call may still finish in the background:
    its result is dropped).
    """

    def __init__(self, call: Callable[[], T], future: Future[T] | None) -> None:
        self._call = call
        self._future = future

    def running(self) -> bool:
        """Whether the call is running on the pool right now (started, not finished)."""
        return self._future is not None and self._future.running()

    def queued(self) -> bool:
        """Whether the call waits for a pool thread (not started yet)."""
        future = self._future
        return future is not None and not future.running() and not future.done()

    def result(self, deadline: float) -> T:
        """The call's result; `deadline` is a `time.perf_counter()` instant."""
        future = self._future
        if future is None or future.cancel():
            return self._call()
        try:
            return future.result(timeout=max(0.0, deadline - time.perf_counter()))
        except FutureTimeout:
            raise DeadlinePassed from None


class SourcePool:
    """A bounded thread pool for a request's second engine call (see the module doc).

    Calls run in a copy of the caller's `contextvars` context (the request's
    `contracts.timing` engine clock keeps counting). Thread-safe; `close` waits for the
    calls running, and a pool started nothing after it (`start` then runs the call on
    the caller's thread when its result is asked for).
    """

    def __init__(self, workers: int = DEFAULT_WORKERS) -> None:
        if workers < 1:
            raise ValueError("a source pool needs at least one worker")
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="orrery-source")
        self._lock = threading.Lock()
        self._closed = False

    def start(self, call: Callable[[], T]) -> Pending[T]:
        """Start `call` on the pool; its result comes from `Pending.result`."""
        context = contextvars.copy_context()

        def run() -> T:
            return context.run(call)

        with self._lock:
            if self._closed:
                return Pending(call, None)
            return Pending(run, self._executor.submit(run))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)


_SHARED: SourcePool | None = None
_SHARED_LOCK = threading.Lock()


def shared_source_pool() -> SourcePool:
    """The process's pool, made on first use (every query stack of a process shares it:
    its threads only ever wait on engines)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = SourcePool()
        return _SHARED
