"""The embedded event log: ingest's SQLite outbox table, read by position."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from contracts.errors import DependencyUnavailable
from contracts.events import LogEntry, RecordChanged, outbox_event_json
from projector.ports import Undecodable

__all__ = [
    "EXPECTED_WAIT_SECONDS",
    "HANDOVER_WAIT_SECONDS",
    "MAX_FETCH_BYTES",
    "MAX_REMEMBERED",
    "OVERTAKE_POLL_SECONDS",
    "SqliteOutboxLog",
]

# Remembered events held at most: four default projector batches, ~10 KB each with a
# 384-d vector (a projector further behind reads the rest from the table).
MAX_REMEMBERED = 8_192
# Positions per `IN (...)` read of rows that were not remembered.
_CHUNK = 500
# The most event bytes one `fetch` reads from the table (at least one event): a batch of
# large records is cut short instead of loading them all (issue 22: bounded memory).
MAX_FETCH_BYTES = 32 * 1024 * 1024
# How long `fetch` waits, at most, for the hand-over of positions committed after every
# position handed over so far (`SqliteOutboxLog.remember`): the embedded store hands
# over right after its commit.
HANDOVER_WAIT_SECONDS = 0.05
# How long while a hand-over is announced (`SqliteOutboxLog.expecting`): a write
# worker's batch of 2,000 384-d records arrives 60-150 ms after its commit on a quiet
# machine (pickled, sent, then unpickled chunk by chunk in the server), seconds at load
# 30; decoding it from the table instead takes ~90 ms of the interpreter, more there.
EXPECTED_WAIT_SECONDS = 2.0
# How often an announced wait looks for rows of namespaces with no hand-over announced
# committed behind the positions it waits for (then it stops: they are not held for
# another namespace's hand-over).
OVERTAKE_POLL_SECONDS = 0.05


class SqliteOutboxLog:
    """`EventLog` over the outbox table (positions are outbox row ids).

    Guarantees: entries come back in position order; a position is never reused. Rows
    appear only after the writing transaction committed, so a reader never sees an
    event whose record is not stored. The reader's position is the projector's
    (`start_after`, stored in the same transaction as its effects), so acknowledging
    only moves the in-memory mark that `reset` returns to. A row whose `event_json` is
    not a valid `RecordChanged` comes back as an `Undecodable` (`outbox@<position>`).
    `lag` counts the rows after the acknowledged position.

    `remember` takes events this process just committed to the outbox, already decoded
    (the embedded write path hands them over): `fetch` still reads which positions are
    committed from the table, but takes a remembered position's event instead of
    reading and decoding its row again. At most `MAX_REMEMBERED` are held; acknowledged
    ones are dropped.

    The writer hands events over right after its commit, so a fetch between the two
    would read and decode rows (~45-60 us a 384-d record) whose events are about to
    arrive (with a low `ORRERY_INGEST_MAX_LAG_EVENTS` the projector is mostly caught up
    and took most of a batch that way). Once events are handed over, a fetch that finds
    positions past the newest handed-over one missing waits up to
    `handover_wait_seconds` for them (while nothing else is held), or up to
    `expected_wait_seconds` while a writer announces its hand-over for the namespaces of
    every position waited for (`expecting`: the write workers' batches come back
    through a pipe). If hand-overs came
    during the wait but the first of those positions is still missing, and positions
    before it are there, the batch ends before it (a hand-over in chunks, still
    arriving: the next fetch waits for the rest again); otherwise the missing rows are
    read from the table. A wait that saw no
    hand-over at all is not repeated before the next hand-over. So a record too large
    to be handed over, or a writer that does not hand over (a CLI import beside the
    server), costs at most two waits per hand-over of this process's writers, never a
    different answer: the same entries in the same order, in batches cut at other
    places.

    Tenancy: one namespace's hand-over never holds another namespace's entries that are
    ready. A fetch whose positions waited for follow positions of another namespace
    returns those first without waiting (the batch ends before the first position
    waited for); the long wait applies only while every position waited for belongs to
    a namespace whose hand-over is announced and no row of a namespace with no
    hand-over announced is committed behind them (looked for every
    `OVERTAKE_POLL_SECONDS`), so such rows, in the batch or committed after it, cost
    the short wait at most (then the positions waited for are read from the table);
    and a later hand-over (of any namespace) ends the wait for every position before
    it, so rows behind of another announced namespace wait for their own hand-over
    only. So a namespace's entries wait for another namespace's announced hand-over
    no longer than the short wait plus one look, or than their own hand-over.
    """

    def __init__(
        self,
        path: Path,
        *,
        start_after: int = 0,
        handover_wait_seconds: float = HANDOVER_WAIT_SECONDS,
        expected_wait_seconds: float = EXPECTED_WAIT_SECONDS,
    ) -> None:
        self._lock = threading.Lock()
        self._handed_over = threading.Condition(self._lock)
        self._handover_wait = handover_wait_seconds
        self._expected_wait = expected_wait_seconds
        # Hand-overs announced and not yet over (`expecting`), per namespace.
        self._expected: Counter[str] = Counter()
        # The newest position ever handed over (0: none yet, nothing to wait for).
        self._newest_handed_over = 0
        # `_newest_handed_over` when a wait ran out without any hand-over (-1: never).
        self._waited_in_vain = -1
        self._cursor = start_after
        self._acknowledged = start_after
        self._remembered: dict[int, LogEntry] = {}
        self._has_trace_column = False
        try:
            self._conn = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {path}: {exc}") from exc

    def fetch(self, limit: int) -> list[LogEntry | Undecodable]:
        try:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT position, namespace FROM outbox WHERE position > ? "
                    "ORDER BY position LIMIT ?",
                    (self._cursor, limit),
                ).fetchall()
                if not rows:
                    return []
                positions = [int(row[0]) for row in rows]
                spaces = {int(row[0]): str(row[1]) for row in rows}
                remembered = self._remembered
                positions, missing, arriving = self._awaited_missing(positions, spaces)
                late = next((p for p in missing if p > self._newest_handed_over), None)
                if arriving and late is not None and late > positions[0]:
                    # Still coming (a hand-over in chunks, past the wait): this batch
                    # ends before it, the next fetch waits for it again.
                    positions = [p for p in positions if p < late]
                    missing = [p for p in missing if p < late]
                bodies = self._read_events(missing)
                if len(bodies) < len(missing):
                    # The byte budget ran out: this batch ends before the first row unread.
                    cut = missing[len(bodies)]
                    positions = [p for p in positions if p < cut]
                self._cursor = positions[-1]
                found = {p: remembered[p] for p in positions if p in remembered}
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return [found[p] if p in found else _decode(p, *bodies[p]) for p in positions]

    def _awaited_missing(
        self, positions: list[int], spaces: dict[int, str]
    ) -> tuple[list[int], list[int], bool]:
        """`positions` (cut short, see below) and those of them not remembered, after
        waiting (lock held; released meanwhile) for those past the newest position
        handed over: up to the hand-over wait, or up to the expected wait while a
        hand-over is announced for the namespace of each of them (`expecting`); and
        whether the wait ran out while hand-overs were arriving (some came, not all).
        Positions of another namespace before the first one waited for are not held
        for it: the batch ends before that one, with no wait."""
        remembered = self._remembered
        missing = [p for p in positions if p not in remembered]
        if not missing:
            return positions, missing, False
        newest = self._newest_handed_over
        first = next((p for p in missing if p > newest), None)
        if first is not None and first > positions[0]:
            # Everything from `first` on is missing (remembered positions are never past
            # the newest handed over): its namespaces are the ones waited for.
            awaited = {spaces[p] for p in positions if p >= first}
            if any(spaces[p] not in awaited for p in positions if p < first):
                cut = [p for p in positions if p < first]
                return cut, [p for p in missing if p < first], False
        started = time.monotonic()
        # The last wait saw no hand-over at all: another writer's rows, most likely (a
        # CLI import beside the server). No short wait again before the next hand-over.
        short = newest and newest != self._waited_in_vain
        deadline = started + (self._handover_wait if short else 0.0)
        announced = started + self._expected_wait
        # Set once rows of a namespace with no hand-over announced were committed behind
        # the positions waited for: from then on only the short wait applies.
        overtaken = False
        while missing and missing[-1] > self._newest_handed_over:
            waited = {spaces[p] for p in missing if p > self._newest_handed_over}
            long = not overtaken and all(self._expected[space] > 0 for space in waited)
            # Rows behind of a namespace whose own hand-over is announced wait for that
            # hand-over anyway, and its arrival ends this wait (it is past these).
            if long and self._committed_behind(positions[-1], waited | set(self._expected)):
                overtaken, long = True, False
            remaining = (announced if long else deadline) - time.monotonic()
            if remaining <= 0:
                if self._newest_handed_over == newest:
                    self._waited_in_vain = newest
                    return positions, missing, False
                return positions, missing, True
            # A long wait looks again for rows of other namespaces behind it now and then.
            self._handed_over.wait(min(remaining, OVERTAKE_POLL_SECONDS) if long else remaining)
            missing = [p for p in missing if p not in remembered]
        return positions, missing, False

    def _committed_behind(self, after: int, namespaces: set[str]) -> bool:
        """Whether a row of a namespace not in `namespaces` is committed past `after`
        (lock held): one rowid range read of the rows committed since the batch was
        fetched."""
        marks = ",".join("?" * len(namespaces))
        row = self._conn.execute(
            f"SELECT 1 FROM outbox WHERE position > ? AND namespace NOT IN ({marks}) LIMIT 1",
            (after, *sorted(namespaces)),
        ).fetchone()
        return row is not None

    @contextmanager
    def expecting(self, namespaces: Iterable[str]) -> Iterator[None]:
        """Announce a hand-over of events of `namespaces` on its way while held (a write
        worker's batch: committed in the worker, its events pickled, sent and unpickled
        here before `remember`): a fetch that finds positions past the newest handed
        over, all of namespaces announced, waits for them up to `expected_wait_seconds`
        (not the shorter hand-over wait). Guarantee expected of the caller: it holds
        this from before the write commits until its events were handed over (or will
        not be), and `namespaces` holds the namespace of each of them."""
        spaces = set(namespaces)
        with self._lock:
            self._expected.update(spaces)
        try:
            yield
        finally:
            with self._lock:
                for space in spaces:
                    self._expected[space] -= 1
                    if self._expected[space] <= 0:
                        del self._expected[space]
                self._handed_over.notify_all()

    def remember(self, entries: Sequence[LogEntry]) -> None:
        """Hold `entries` (committed outbox rows, decoded) for `fetch`. Guarantee
        expected of the caller: each entry is exactly the event its row decodes to."""
        with self._lock:
            room = MAX_REMEMBERED - len(self._remembered)
            for entry in entries[: max(room, 0)]:
                if entry.position > self._acknowledged:
                    self._remembered[entry.position] = entry
            if entries:
                newest = max(entry.position for entry in entries)
                self._newest_handed_over = max(self._newest_handed_over, newest)
            self._handed_over.notify_all()

    def _read_events(self, positions: list[int]) -> dict[int, tuple[str | bytes, str | None]]:
        """The events of these outbox rows and their writes' trace contexts, read from
        the table, in position order until `MAX_FETCH_BYTES` are read (at least one): a
        prefix of `positions`. Lock held."""
        bodies: dict[int, tuple[str | bytes, str | None]] = {}
        budget = MAX_FETCH_BYTES
        traced = self._traced()
        for start in range(0, len(positions), _CHUNK):
            chunk = positions[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            trace = "o.trace_context" if traced else "NULL"
            for position, event, record, context in self._conn.execute(
                f"SELECT o.position, o.event_json, r.record_json, {trace} FROM outbox o "
                "LEFT JOIN records r ON r.document_id = o.document_id "
                f"AND r.revision = o.revision WHERE o.position IN ({marks}) "
                "ORDER BY o.position",
                chunk,
            ):
                if bodies and budget <= 0:
                    return bodies
                body = outbox_event_json(event, record)
                budget -= len(body)
                bodies[int(position)] = (body, context)
        return bodies

    def _traced(self) -> bool:
        """Whether the outbox has the `trace_context` column (the canonical store adds
        it when it opens; a database it has not opened since has none). Lock held."""
        if not self._has_trace_column:
            columns = {row[1] for row in self._conn.execute("PRAGMA table_info(outbox)")}
            self._has_trace_column = "trace_context" in columns
        return self._has_trace_column

    def acknowledge(self, entries: Sequence[LogEntry | Undecodable]) -> None:
        positions = [e.position for e in entries if e.position is not None]
        if positions:
            with self._lock:
                self._acknowledged = max(self._acknowledged, max(positions))
                for position in positions:
                    self._remembered.pop(position, None)

    def reset(self) -> None:
        with self._lock:
            self._cursor = self._acknowledged

    def high_water(self) -> int:
        try:
            with self._lock:
                row = self._conn.execute("SELECT COALESCE(MAX(position), 0) FROM outbox").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return int(row[0])

    def lag(self) -> int:
        try:
            with self._lock:
                row = self._conn.execute(
                    "SELECT COUNT(*) FROM outbox WHERE position > ?", (self._acknowledged,)
                ).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return int(row[0])

    def pending_events(self, after: int) -> list[tuple[str, int]]:
        """`(namespace, position)` of every outbox row after `after`, in position order
        (a restarted process learns each namespace's backlog from it)."""
        try:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT namespace, position FROM outbox WHERE position > ? ORDER BY position",
                    (after,),
                ).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return [(str(ns), int(position)) for ns, position in rows]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _decode(
    position: int, body: object, trace_context: str | None = None
) -> LogEntry | Undecodable:
    raw = body if isinstance(body, bytes) else str(body).encode()
    try:
        return LogEntry(
            position=position,
            event=RecordChanged.model_validate_json(raw),
            trace_context=trace_context,
        )
    except ValidationError as exc:
        return Undecodable(
            where=f"outbox@{position}",
            position=position,
            key=None,
            value=raw,
            headers=(),
            reason=f"not a RecordChanged event: {exc.error_count()} error(s): "
            + "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '-'}: {e['msg']}" for e in exc.errors()[:3]
            ),
        )
