"""What every Kafka event-log adapter shares, whichever client library it drives.

The wire format (written by the relay's publishers: `ingest.adapters.kafka_publisher`
and `ingest.adapters.confluent_publisher`): one topic per namespace named
`topic_for(topic_prefix, namespace)`, key = document id, value = `RecordChanged` JSON,
header `orrery-position` = the outbox position in ASCII digits, optional trace header,
optional `orrery-vector-f32` = the record's vector as float32 bytes (read instead of the
vector's decimals; messages without it, e.g. written before it, decode as before).

Here: the settings, the decoding of one message into a `LogEntry` or an `Undecodable`,
the bootstrap reachability check, and the bookkeeping of what may be committed
(`DeliveryLedger`). No Kafka client is imported, so an adapter loads only its own.
"""

from __future__ import annotations

import logging
import re
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import ValidationError

from contracts.bootstrap_probe import unreachable
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.events import (
    POSITION_HEADER,
    TRACE_HEADER,
    VECTOR_HEADER,
    LogEntry,
    decode_record_changed,
    topic_pattern,
)
from contracts.trusted import trusted_constructor
from projector.ports import Undecodable

__all__ = [
    "POSITION_HEADER",
    "Delivered",
    "DeliveryLedger",
    "GroupEventLog",
    "KafkaLogSettings",
    "Partition",
    "decode_message",
    "position_of",
    "unreachable",
]

# (topic, partition): kafka-python's `TopicPartition` is a named tuple equal to it.
Partition = tuple[str, int]
Headers = Sequence[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class KafkaLogSettings:
    """How a projector reads Kafka. Defaults are for production; tests shrink the timeouts.

    - `session_timeout_ms` / `heartbeat_interval_ms`: a member that misses heartbeats
      this long is dropped and its partitions move. Joining a group takes about half
      the session timeout; the broker accepts 6,000 ms at least (tests use that, with
      a 1,000 ms heartbeat).
    - `max_poll_interval_ms`: the longest a projector may spend between fetches (one
      batch: embedding and index writes) before it loses its partitions. It is also the
      longest a rebalance waits for slow members.
    - `metadata_max_age_ms`: a new namespace's topic is picked up within this time.
    - `poll_timeout_ms`: how long an idle `fetch` waits for new events (long poll).
    - `join_timeout_ms`: how long `fetch` waits to become a stable group member before
      it reports Kafka unavailable and drops its consumer (the next `fetch` joins as a
      new member: a join that never completes cannot wedge the projector).
    - `topic_refresh_ms`: a matching topic that `lag` / `high_water` saw but this
      member is not subscribed to yet makes `fetch` refresh the topic metadata at most
      this often, so a new namespace is read within about one fetch, not after
      `metadata_max_age_ms`.
    - `check_crcs`: verify each record batch's CRC-32C. kafka-python computes it in
      pure Python unless the `crc32c` package is installed (a dependency: in C the
      check is cheap; in pure Python it was ~60% of a projector's CPU); librdkafka
      computes it in C.
    """

    bootstrap_servers: str
    group_id: str = "orrery-projector"
    topic_prefix: str = "orrery.records"
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    metadata_max_age_ms: int = 30_000
    poll_timeout_ms: int = 500
    join_timeout_ms: int = 60_000
    topic_refresh_ms: int = 1_000
    request_timeout_ms: int = 30_000
    bootstrap_timeout_ms: int = 10_000
    connect_timeout_s: float = 2.0
    check_crcs: bool = True
    client_id: str = "orrery-projector"

    @property
    def topic_pattern(self) -> str:
        """The regular expression of the topics read: every namespace under the prefix."""
        return topic_pattern(self.topic_prefix)


def _raw(value: object) -> bytes:
    if value is None:
        return b""
    return value if isinstance(value, bytes) else str(value).encode()


def _header(headers: Headers | None, name: str) -> bytes | None:
    """The last value of header `name` (as `dict(headers)` reads it)."""
    found: bytes | None = None
    for key, value in headers or ():
        if key == name:
            found = value
    return found


def _undecodable_error(
    where: str, problem: object, topic: str, partition: int, offset: int
) -> OrreryError:
    return OrreryError(
        ErrorCode.INTERNAL,
        f"undecodable event at {where}: {problem}",
        {"topic": topic, "partition": partition, "offset": offset},
    )


def position_of(headers: Headers | None, topic: str, partition: int, offset: int) -> int:
    """The `orrery-position` header's value; `OrreryError` when it is missing or bad."""
    where = f"{topic}/{partition}@{offset}"
    raw = _header(headers, POSITION_HEADER)
    if raw is None:
        raise _undecodable_error(where, f"no {POSITION_HEADER} header", topic, partition, offset)
    try:
        position = int(raw.decode("ascii"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _undecodable_error(
            where, f"bad {POSITION_HEADER} header {raw!r}", topic, partition, offset
        ) from exc
    if position < 1:
        raise _undecodable_error(
            where, f"bad {POSITION_HEADER} header {raw!r}", topic, partition, offset
        )
    return position


# `LogEntry.model_construct` without its walk over the fields (`contracts.trusted`).
_LOG_ENTRY = trusted_constructor(LogEntry)


def _trace_context(headers: Headers | None) -> str | None:
    raw = _header(headers, TRACE_HEADER)
    if not raw:
        return None
    try:
        return str(raw.decode("ascii"))[:128]
    except UnicodeDecodeError:
        return None  # a trace context is a hint: a bad one is dropped, the event kept


def decode_message(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None,
) -> LogEntry | Undecodable:
    """The message's `LogEntry`, or an `Undecodable` holding its raw bytes and the reason
    (without a position: the header of a message that failed to decode is not trusted)."""
    try:
        # Built from checked parts (a position >= 1, a validated event, a trace context
        # of at most 128 characters or None): `LogEntry(...)` would check them again.
        return _LOG_ENTRY(
            position=position_of(headers, topic, partition, offset),
            event=decode_record_changed(
                value if value is not None else b"", _header(headers, VECTOR_HEADER)
            ),
            trace_context=_trace_context(headers),
            partition=partition,
            offset=offset,
        )
    except (OrreryError, ValidationError, ValueError, TypeError) as exc:
        reason = (
            f"not a RecordChanged event: {exc.error_count()} error(s): "
            + "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '-'}: {e['msg']}" for e in exc.errors()[:3]
            )
            if isinstance(exc, ValidationError)
            else str(exc)
        )
        return Undecodable(
            where=f"kafka:{topic}/{partition}@{offset}",
            position=None,
            key=None if key is None else _raw(key),
            value=_raw(value),
            headers=tuple((str(k), _raw(v)) for k, v in (headers or ())),
            reason=reason,
        )


@dataclass(frozen=True, slots=True)
class Delivered:
    """One message `fetch` returned: its entry and where it sits on the log."""

    entry: LogEntry | Undecodable
    partition: Partition
    offset: int
    leader_epoch: int


class DeliveryLedger:
    """The deliveries of one consumer not acknowledged yet, and what may be committed.

    Guarantees: per partition, `commit_offsets` never passes a delivery that is still
    pending; an acknowledgement held back by an older pending delivery is remembered and
    committed with it; partitions no longer assigned are never committed (their next
    owner delivers those events again).
    """

    def __init__(self) -> None:
        self._pending: list[Delivered] = []
        # Per partition, the newest acknowledged delivery whose commit is still held back
        # by an older pending one: acknowledgements may come out of offset order.
        self._acked: dict[Partition, Delivered] = {}

    def deliver(self, delivered: Iterable[Delivered]) -> list[LogEntry | Undecodable]:
        """Record `delivered` as pending and return their entries, in order."""
        batch = list(delivered)
        self._pending.extend(batch)
        return [d.entry for d in batch]

    def clear(self) -> None:
        self._pending.clear()
        self._acked.clear()

    def take(self, entries: Sequence[LogEntry | Undecodable]) -> list[Delivered]:
        """Remove and return the pending deliveries of `entries`.

        Matches the very objects `fetch` returned first; equal copies are matched by
        position, oldest delivery first. Unknown entries (already acknowledged, or
        dropped by a reset) match nothing.
        """
        wanted = {id(entry) for entry in entries}
        taken: list[Delivered] = []
        kept: list[Delivered] = []
        for delivered in self._pending:
            (taken if id(delivered.entry) in wanted else kept).append(delivered)
        if len(taken) < len(entries):
            found = {id(d.entry) for d in taken}
            by_position = Counter(e.position for e in entries if id(e) not in found)
            rest: list[Delivered] = []
            for delivered in kept:
                if by_position[delivered.entry.position] > 0:
                    by_position[delivered.entry.position] -= 1
                    taken.append(delivered)
                else:
                    rest.append(delivered)
            kept = rest
        self._pending = kept
        return taken

    def commit_offsets(
        self, acked: Sequence[Delivered], assigned: Container[Partition]
    ) -> dict[Partition, tuple[int, int]]:
        """Per owned partition: (the offset after the acknowledged events, held back to
        the oldest event still pending there; the leader epoch of the newest of them).
        A commit means "everything before is done"."""
        offsets: dict[Partition, tuple[int, int]] = {}
        for partition in {d.partition for d in acked}:
            if partition not in assigned:
                self._acked.pop(partition, None)
                continue  # revoked: its new owner delivers these events again
            candidates = [d for d in acked if d.partition == partition]
            if partition in self._acked:
                candidates.append(self._acked.pop(partition))
            last = max(candidates, key=lambda d: d.offset)
            next_offset = last.offset + 1
            pending = [d.offset for d in self._pending if d.partition == partition]
            if pending and min(pending) < next_offset:
                next_offset = min(pending)
                self._acked[partition] = last
            offsets[partition] = (next_offset, last.leader_epoch)
        return offsets


log = logging.getLogger("orrery.projector")


class GroupEventLog(ABC):
    """What the two Kafka event logs (`kafka_log.KafkaEventLog` on kafka-python,
    `confluent_log.ConfluentEventLog` on librdkafka) share: their state, and the
    `EventLog` calls whose steps do not depend on the client — a failed `fetch` rewinds
    to the committed offsets, `reset` rewinds, the probes close their clients on an
    error, `close` leaves the group and commits nothing. A subclass names its client's
    errors (`driver_errors`) and supplies the steps that talk to it."""

    # The client's exceptions that become `DependencyUnavailable("kafka", ...)`.
    driver_errors: ClassVar[tuple[type[Exception], ...]]

    def __init__(self, settings: KafkaLogSettings) -> None:
        self._settings = settings
        self._pattern = re.compile(settings.topic_pattern)
        self._lock = threading.Lock()
        self._probe_lock = threading.Lock()
        self._consumer: Any = None
        self._probe: Any = None
        self._ledger = DeliveryLedger()
        self._closed = False
        # Set when a commit failed: its entries are delivered again from the committed
        # offsets (with a client that retries its fetches inside, e.g. librdkafka during a
        # broker outage, no failed fetch would rewind for it).
        self._rewind_due = False
        # Matching topics the probe clients saw (written under _probe_lock, read by the
        # fetching thread: a frozenset is replaced, never mutated).
        self._probed_topics: frozenset[str] = frozenset()
        self._next_topic_refresh = 0.0

    def fetch(self, limit: int) -> list[LogEntry | Undecodable]:
        if limit < 1:
            return []
        caught: tuple[type[Exception], ...] = (*self.driver_errors, OrreryError)
        with self._lock:
            consumer = self._connected_consumer()
            if self._rewind_due:
                self._rewind_due = False
                self._rewind_quietly(consumer)  # or drops it: its successor starts there
                consumer = self._connected_consumer()
            try:
                return self._fetch(consumer, limit)
            except caught as exc:
                # Polled records moved the position already: go back to the committed
                # offsets so nothing polled-but-not-returned is skipped (a dropped
                # consumer's successor starts there anyway).
                if self._consumer is consumer:
                    self._rewind_quietly(consumer)
                if isinstance(exc, OrreryError):
                    raise
                raise self._unavailable("fetch", exc) from exc

    def reset(self) -> None:
        with self._lock:
            self._ledger.clear()
            if self._consumer is None:
                return
            try:
                self._rewind(self._consumer)
            except self.driver_errors as exc:
                raise self._unavailable("reset", exc) from exc

    def high_water(self) -> int:
        with self._probe_lock:
            try:
                return self._read_high_water()
            except self.driver_errors as exc:
                self._close_probe()
                raise self._unavailable("high_water", exc) from exc

    def lag(self) -> int:
        with self._probe_lock:
            try:
                return self._read_lag()
            except self.driver_errors as exc:
                self._close_probe()
                raise self._unavailable("lag", exc) from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            consumer, self._consumer = self._consumer, None
            self._ledger.clear()
            if consumer is not None:
                try:
                    self._close_consumer(consumer)  # leaves the group; commits nothing
                except Exception:
                    log.warning("closing the Kafka consumer failed", exc_info=True)
        with self._probe_lock:
            self._close_probe()

    def _rewind_quietly(self, consumer: Any) -> None:
        try:
            self._rewind(consumer)
        except Exception:
            # Dropping the consumer is the last resort: a new one resumes at the
            # committed offsets, which is exactly what the rewind wanted.
            log.warning("rewinding the Kafka consumer failed; reconnecting", exc_info=True)
            self._drop(consumer)

    def _drop(self, consumer: Any) -> None:
        """Close `consumer` (it leaves the group) and forget it and its deliveries."""
        if self._consumer is consumer:
            self._consumer = None
        self._rewind_due = False  # a new member starts at the committed offsets
        self._forget_membership()
        self._ledger.clear()
        try:
            self._close_consumer(consumer)
        except Exception:
            log.debug("closing the Kafka consumer failed", exc_info=True)

    @abstractmethod
    def _forget_membership(self) -> None:
        """Forget what the subclass keeps about a dropped consumer's membership."""

    @abstractmethod
    def _connected_consumer(self) -> Any:
        """The group member, joined on first use."""

    @abstractmethod
    def _fetch(self, consumer: Any, limit: int) -> list[LogEntry | Undecodable]:
        """`fetch`'s work with the client (its errors are handled by `fetch`)."""

    @abstractmethod
    def _rewind(self, consumer: Any) -> None:
        """Seek every owned partition to its committed offset; clear the ledger."""

    @abstractmethod
    def _read_high_water(self) -> int: ...

    @abstractmethod
    def _read_lag(self) -> int: ...

    @abstractmethod
    def _close_probe(self) -> None: ...

    @abstractmethod
    def _close_consumer(self, consumer: Any) -> None:
        """Close the member without committing (it leaves the group)."""

    @abstractmethod
    def _unavailable(self, operation: str, exc: Exception) -> DependencyUnavailable: ...
