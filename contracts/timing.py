"""Time spent inside engine libraries during one request: what the raw engines cost,
against which the server's own stage times are compared (`QueryPlan.engine_ms`).

Adapters wrap each call into an engine library in `engine_call(name)`; a request that
wants the totals opens an `engine_clock()` around its work. Outside a clock the calls
are not timed (no cost beyond one context-variable read). Stdlib only, no I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["engine_call", "engine_clock", "engine_reported", "gil_let_go", "gil_let_go_watch"]

_TOTALS: ContextVar[dict[str, float] | None] = ContextVar("orrery_engine_ms", default=None)
# Set by `gil_let_go` (see `gil_let_go_watch`).
_LET_GO: ContextVar[threading.Event | None] = ContextVar("orrery_gil_let_go", default=None)
# A request's calls may run on two threads at once (`query.overlap`), adding to one dict.
_ADD = threading.Lock()


@contextmanager
def engine_clock() -> Iterator[dict[str, float]]:
    """Collect, in the returned dict, milliseconds per engine of every `engine_call` made
    in this context (thread, or a thread running a copy of it) until the block ends.
    Calls that overlap in time each count in full."""
    totals: dict[str, float] = {}
    token = _TOTALS.set(totals)
    try:
        yield totals
    finally:
        _TOTALS.reset(token)


def engine_call(engine: str) -> _EngineCall:
    """Add the block's wall time to `engine` of the current clock, if there is one."""
    return _EngineCall(engine)


class _EngineCall:
    """`engine_call`'s context manager: a class, not a generator (`contextlib`'s
    `contextmanager` builds a generator and a wrapper per block, ~1.5 us; a request
    makes several of these)."""

    __slots__ = ("_engine", "_started", "_totals")

    def __init__(self, engine: str) -> None:
        self._engine = engine

    def __enter__(self) -> None:
        self._totals = _TOTALS.get()
        if self._totals is not None:
            self._started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        totals = self._totals
        if totals is None:
            return
        elapsed = (time.perf_counter() - self._started) * 1000.0
        engine = self._engine
        with _ADD:
            totals[engine] = totals.get(engine, 0.0) + elapsed


def engine_reported(engine: str, milliseconds: float) -> None:
    """Add a time an engine reported about itself (OpenSearch's `took`, Qdrant's
    `time`) to `engine` of the current clock, if there is one: beside the wall time of
    the same call (`engine_call`), it splits the engine's own work from the client
    library's and the network's."""
    totals = _TOTALS.get()
    if totals is None:
        return
    with _ADD:
        totals[engine] = totals.get(engine, 0.0) + milliseconds


@contextmanager
def gil_let_go_watch() -> Iterator[threading.Event]:
    """An event that `gil_let_go` sets when called in this context or in a copy of it
    made inside the block (a call started on `query.overlap`'s pool copies it): the
    caller can wait until another thread's engine call no longer needs the GIL."""
    event = threading.Event()
    token = _LET_GO.set(event)
    try:
        yield event
    finally:
        _LET_GO.reset(token)


def gil_let_go() -> None:
    """Called by an adapter right before an engine call that waits in native code with
    the GIL released (tantivy's search): sets the event of `gil_let_go_watch`, if the
    current context has one (else one context-variable read)."""
    event = _LET_GO.get()
    if event is not None:
        event.set()
