"""The server-mode event log on confluent-kafka (librdkafka, compiled).

Reads what the relay's publishers write (`projector.adapters.kafka_wire` describes the
format), in the same consumer group protocol as `projector.adapters.kafka_log`: range and
round-robin assignment, explicit commits. Group membership, heartbeats and prefetching
run in librdkafka's own threads, in C, so neither the projector's batch work nor the GIL
can starve them (kafka-python drives its group coordination from `poll`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from contracts.errors import DependencyUnavailable, OrreryError
from contracts.events import LogEntry
from projector.adapters.kafka_wire import (
    Delivered,
    GroupEventLog,
    KafkaLogSettings,
    Partition,
    decode_message,
    position_of,
    unreachable,
)
from projector.ports import Undecodable

__all__ = ["ConfluentEventLog", "KafkaLogSettings"]

log = logging.getLogger("orrery.projector")


# librdkafka's fetch.wait.max.ms (500 ms) plus a margin: how long a partition just sought
# counts as waiting even when its (stale) watermark says it is at its end.
_SEEK_SETTLE_S = 1.0


class _Timeout(Exception):
    """A wait of this adapter ran out (reported as Kafka unavailable, retriable)."""


def _partitions(consumer: Any) -> list[Any]:
    return list(consumer.assignment())


class ConfluentEventLog(GroupEventLog):
    """`EventLog` over the relay's topics, read by one member of a Kafka consumer group,
    with librdkafka's consumer.

    Guarantees (those of `KafkaEventLog`; one conformance suite checks both):
    - `fetch` returns events of the partitions this member owns, each partition in
      offset order, so every document's events keep the relay's (position) order. It
      waits up to `poll_timeout_ms` when nothing is waiting and returns as many waiting
      events as it can, up to `limit`: an empty list means none was waiting.
    - Offsets are committed only by `acknowledge` (no auto-commit, no offset store),
      synchronously; per partition the commit never passes an event that was delivered
      and not yet acknowledged; acknowledgements may come in any order. `close` commits
      nothing.
    - `reset` moves every owned partition back to its committed offset, so the next
      `fetch` delivers the unacknowledged events again. After a restart, a rebalance, or
      a failed `fetch` the same happens by itself (at-least-once).
    - `high_water`: the largest `orrery-position` among the last record of every
      partition of every matching topic (0 when all are empty).
    - `lag`: the consumer group's lag over every partition of every matching topic, end
      offset minus the group's committed offset (the beginning offset where none).
    - Errors of the client become `DependencyUnavailable("kafka", ...)`; an undecodable
      record comes back as an `Undecodable` in its place and holds its partition's
      commit back until acknowledged.
    - No network I/O before the first call; new namespaces are picked up within
      `metadata_max_age_ms`, or on the next `fetch` once `lag` or `high_water` saw
      their topic.
    - A member not assigned its partitions within `join_timeout_ms` of a `fetch` is
      dropped (closed, leaving the group); the next `fetch` joins with a new consumer.

    Not thread-safe for `fetch` / `acknowledge` / `reset` (one projector thread);
    `high_water` and `lag` may run in another thread (they use their own client).
    """

    driver_errors = (KafkaException, _Timeout)

    def __init__(self, settings: KafkaLogSettings) -> None:
        super().__init__(settings)
        # Partitions `reset` moved back (offset it sought, OFFSET_BEGINNING = -2) that
        # delivered nothing since: the position is stale until a record arrives.
        self._rewound: dict[Partition, int] = {}
        self._rewound_until = 0.0
        # Set by librdkafka's assign callback, cleared by revoke / lost (both are served
        # inside `poll` / `consume`, in the fetching thread).
        self._assigned = False
        self._assigned_at = 0.0
        self._assigned_topics: frozenset[str] = frozenset()
        # Partitions revoked (or lost) since `_fetch` last looked: what the fetch in
        # progress holds of them is dropped, not returned (see `_drop_revoked`).
        self._revoked: set[Partition] = set()
        self._revoked_at = 0.0

    # -- EventLog ------------------------------------------------------------------------

    def acknowledge(self, entries: Sequence[LogEntry | Undecodable]) -> None:
        if not entries:
            return
        with self._lock:
            if self._consumer is None:
                return
            consumer = self._consumer
            try:
                assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
                offsets = self._ledger.commit_offsets(self._ledger.take(entries), assigned)
                if not offsets:
                    return
                committed = consumer.commit(
                    offsets=[
                        TopicPartition(topic, partition, offset, leader_epoch=epoch)
                        if epoch >= 0
                        else TopicPartition(topic, partition, offset)
                        for (topic, partition), (offset, epoch) in offsets.items()
                    ],
                    asynchronous=False,
                )
                failed = [tp for tp in committed or () if tp.error is not None]
                if failed:
                    raise KafkaException(failed[0].error)
            except KafkaException as exc:
                # Nothing of these was committed and the ledger let them go: the next
                # fetch goes back to the committed offsets, so they are delivered again.
                self._rewind_due = True
                raise self._unavailable("acknowledge", exc) from exc

    # -- fetch ---------------------------------------------------------------------------

    def _config(self, client_id: str) -> dict[str, Any]:
        s = self._settings
        return {
            "bootstrap.servers": s.bootstrap_servers,
            "client.id": client_id,
            "group.id": s.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": s.session_timeout_ms,
            "heartbeat.interval.ms": s.heartbeat_interval_ms,
            "max.poll.interval.ms": s.max_poll_interval_ms,
            "topic.metadata.refresh.interval.ms": s.metadata_max_age_ms,
            "socket.connection.setup.timeout.ms": s.bootstrap_timeout_ms,
            "check.crcs": s.check_crcs,
            # The classic protocol with kafka-python's default assignors, so members of
            # either client can share one group (a rolling switch of the client).
            "partition.assignment.strategy": "range,roundrobin",
            "logger": log,
        }

    def _connected_consumer(self) -> Any:
        if self._closed:
            raise DependencyUnavailable("kafka", "the event log is closed")
        if self._consumer is None:
            s = self._settings
            reason = unreachable(s.bootstrap_servers, s.connect_timeout_s)
            if reason is not None:
                raise DependencyUnavailable(
                    "kafka",
                    f"no bootstrap server reachable ({reason})",
                    {"bootstrap_servers": s.bootstrap_servers},
                )
            try:
                consumer = Consumer(self._config(s.client_id))
                consumer.subscribe(
                    [s.topic_pattern],
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_revoke,
                )
            except KafkaException as exc:
                raise self._unavailable("connect", exc) from exc
            self._assigned = False
            self._consumer = consumer
        return self._consumer

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned = True
        self._assigned_at = time.monotonic()
        self._assigned_topics = frozenset(tp.topic for tp in partitions)
        self._rewound.clear()  # a new assignment starts at the committed offsets

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned = False
        self._revoked.update((tp.topic, tp.partition) for tp in partitions)
        self._revoked_at = time.monotonic()

    def _fetch(self, consumer: Any, limit: int) -> list[LogEntry | Undecodable]:
        s = self._settings
        self._refresh_topics(consumer)
        started = time.monotonic()
        join_s = s.join_timeout_ms / 1000
        # Records on their way to this member are waited for this long at most, from the
        # fetch's start or the assignment (the first fetch response after it, or after a
        # seek, which first waits out the fetch in flight: fetch.wait.max.ms, 500).
        catch_up_s = max(2 * s.poll_timeout_ms / 1000, 5.0)
        poll_s = s.poll_timeout_ms / 1000
        out: list[Delivered] = []
        self._revoked.clear()
        polled_unassigned = False
        while len(out) < limit:
            # Each call may serve a rebalance's callbacks: what it revoked is dropped.
            messages = consumer.consume(limit - len(out), timeout=0)
            out = self._drop_revoked(consumer, out, self._deliver(messages))
            if not messages:
                now = time.monotonic()
                # A revoke in this fetch starts its wait for the rejoin over.
                join_deadline = max(started, self._revoked_at) + join_s
                if not self._assigned:
                    if out or now >= join_deadline:
                        break
                    if polled_unassigned and not self._matching_topics(consumer):
                        # librdkafka joins only once the pattern matches a topic: until
                        # then this member is as stable as it gets, and nothing waits.
                        break
                    polled_unassigned = True
                    # Joining (or rebalancing): the callbacks are served inside poll.
                    wait = min(poll_s, join_deadline - now)
                elif not out and now < max(started, self._assigned_at) + poll_s:
                    wait = max(started, self._assigned_at) + poll_s - now
                elif now < max(started, self._assigned_at) + catch_up_s and self._waiting(consumer):
                    wait = 0.05  # records this member owns are still on their way
                else:
                    # A fetch response updates the watermark as it queues its records:
                    # take what arrived while the state above was read.
                    messages = consumer.consume(limit - len(out), timeout=0)
                    out = self._drop_revoked(consumer, out, self._deliver(messages))
                    if not messages:
                        break
                    continue
                message = consumer.poll(wait)
                received = [] if message is None else self._deliver([message])
                out = self._drop_revoked(consumer, out, received)
        joining_since = max(started, self._revoked_at)
        if not out and not self._assigned and time.monotonic() >= joining_since + join_s:
            log.warning(
                "not a stable member of group %r after %d ms: leaving it; the next fetch "
                "joins as a new member",
                s.group_id,
                s.join_timeout_ms,
            )
            self._drop(consumer)
            raise _Timeout(
                f"not a stable member of group {s.group_id!r} after {s.join_timeout_ms} ms;"
                " the consumer was replaced"
            )
        return [d.entry for d in out]

    def _matching_topics(self, consumer: Any) -> list[str]:
        metadata = consumer.list_topics(timeout=self._settings.request_timeout_ms / 1000)
        return [
            name
            for name, topic in metadata.topics.items()
            if topic.error is None and self._pattern.match(name)
        ]

    def _drop_revoked(
        self, consumer: Any, out: list[Delivered], received: list[Delivered]
    ) -> list[Delivered]:
        """`out` and the `received` of the last call, less what a rebalance served in that
        call took away.

        A revoked partition's deliveries this fetch holds were not committed (nothing is
        before `acknowledge`): returned, they would be applied here and again by the
        partition's next owner, which starts at the committed offset — and with the
        eager protocol (range, round-robin) that is this member too for a partition it
        keeps, librdkafka fetching it again from there. So they are dropped, from the
        ledger too. Of the last call's messages, those of a partition not owned now were
        taken before the revoke; a message of an owned partition came after the
        assignment (a poll returns at its first message, and an assignment needs a
        join round trip after the revoke was served)."""
        if not self._revoked:
            out.extend(received)
            return out
        revoked, self._revoked = self._revoked, set()
        owned = {(tp.topic, tp.partition) for tp in _partitions(consumer)}
        kept = [d for d in out if d.partition not in revoked]
        kept.extend(d for d in received if d.partition in owned or d.partition not in revoked)
        if len(kept) < len(out) + len(received):
            kept_ids = {id(d.entry) for d in kept}
            dropped = [d.entry for d in (*out, *received) if id(d.entry) not in kept_ids]
            self._ledger.take(dropped)
            log.info(
                "a rebalance revoked partitions of a fetch in progress: %d uncommitted "
                "events left to their next owner",
                len(dropped),
            )
        return kept

    def _deliver(self, messages: Sequence[Any]) -> list[Delivered]:
        delivered: list[Delivered] = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                # Informational (e.g. a topic of the pattern deleted): the next poll
                # goes on.
                log.info("Kafka consumer: %s", error.str())
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            self._rewound.pop((topic, partition), None)
            epoch = message.leader_epoch()
            delivered.append(
                Delivered(
                    entry=decode_message(
                        topic, partition, offset, message.key(), message.value(), message.headers()
                    ),
                    partition=(topic, partition),
                    offset=offset,
                    leader_epoch=-1 if epoch is None else epoch,
                )
            )
        self._ledger.deliver(delivered)
        return delivered

    def _waiting(self, consumer: Any) -> bool:
        """Whether an owned partition may hold records this member has not returned yet,
        from local state only: no fetch response since the assignment, or the position
        of the last record returned below the high watermark of the last response.

        No round trip: a call that waits on the group coordinator (committed offsets)
        would hold up a rebalance that waits for this thread to serve its callbacks."""
        for tp in consumer.position(_partitions(consumer)):
            high = consumer.get_watermark_offsets(tp, cached=True)[1]
            rewound = self._rewound.get((tp.topic, tp.partition))
            if high < 0 or 0 <= tp.offset < high:
                return True
            # After a seek the cached watermark is stale until a fetch at the new offset
            # answered (librdkafka first waits out the fetch in flight).
            if rewound is not None and (rewound < high or time.monotonic() < self._rewound_until):
                return True
        return False

    def _refresh_topics(self, consumer: Any) -> None:
        """Refresh the metadata when the probe saw a matching topic this member owns no
        partition of: the pattern subscription then takes it (a rebalance) instead of
        waiting for the periodic metadata refresh."""
        unseen = self._probed_topics - self._assigned_topics
        now = time.monotonic()
        if not unseen or now < self._next_topic_refresh:
            return
        self._next_topic_refresh = now + self._settings.topic_refresh_ms / 1000
        log.debug("topics %s unowned: refreshing the consumer's metadata", sorted(unseen))
        consumer.list_topics(timeout=self._settings.request_timeout_ms / 1000)

    # -- reset ---------------------------------------------------------------------------

    def _rewind(self, consumer: Any) -> None:
        self._ledger.clear()
        assigned = _partitions(consumer)
        if not assigned:
            return
        timeout = self._settings.request_timeout_ms / 1000
        for tp in consumer.committed(assigned, timeout=timeout):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            try:
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
                self._rewound[(tp.topic, tp.partition)] = offset
                self._rewound_until = time.monotonic() + _SEEK_SETTLE_S
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError._UNKNOWN_PARTITION:
                    continue  # revoked meanwhile: its next owner starts at the committed offset
                raise

    def _forget_membership(self) -> None:
        self._assigned = False
        self._assigned_topics = frozenset()
        self._rewound.clear()

    def _close_consumer(self, consumer: Any) -> None:
        consumer.close()  # auto-commit and the offset store are off

    # -- high_water / lag -----------------------------------------------------------------

    def _probe_client(self) -> Any:
        """A consumer of the group's id that never subscribes: it reads metadata, offsets
        and the group's commits, and assigns itself partitions to read their last record;
        it never joins the group."""
        if self._closed:
            raise DependencyUnavailable("kafka", "the event log is closed")
        if self._probe is None:
            s = self._settings
            reason = unreachable(s.bootstrap_servers, s.connect_timeout_s)
            if reason is not None:
                raise DependencyUnavailable(
                    "kafka",
                    f"no bootstrap server reachable ({reason})",
                    {"bootstrap_servers": s.bootstrap_servers},
                )
            self._probe = Consumer(self._config(f"{s.client_id}-hw"))
        return self._probe

    def _offsets(self) -> tuple[Any, list[Partition], dict[Partition, tuple[int, int]]]:
        """The probe, every matching partition, and their (begin, end) offsets."""
        timeout = self._settings.request_timeout_ms / 1000
        probe = self._probe_client()
        metadata = probe.list_topics(timeout=timeout)
        topics = {
            name: topic
            for name, topic in metadata.topics.items()
            if topic.error is None and self._pattern.match(name)
        }
        self._probed_topics = frozenset(topics)
        partitions = [(name, p) for name, topic in topics.items() for p in sorted(topic.partitions)]
        marks = {
            (t, p): probe.get_watermark_offsets(TopicPartition(t, p), timeout=timeout)
            for t, p in partitions
        }
        if any(mark is None for mark in marks.values()):
            raise _Timeout("no watermark offsets")
        return probe, partitions, marks

    def _read_high_water(self) -> int:
        s = self._settings
        probe, _, marks = self._offsets()
        last = {tp: end - 1 for tp, (begin, end) in marks.items() if end > begin}
        if not last:
            return 0
        probe.assign([TopicPartition(t, p, offset) for (t, p), offset in last.items()])
        try:
            newest = 0
            remaining = set(last)
            deadline = time.monotonic() + s.request_timeout_ms / 1000
            while remaining:
                if time.monotonic() >= deadline:
                    raise _Timeout(f"could not read the last record of {sorted(remaining)}")
                for message in probe.consume(len(remaining), timeout=s.poll_timeout_ms / 1000):
                    if message.error() is not None:
                        continue
                    remaining.discard((message.topic(), message.partition()))
                    try:
                        position = position_of(
                            message.headers(),
                            message.topic(),
                            message.partition(),
                            message.offset(),
                        )
                    except OrreryError:
                        continue  # undecodable: it has no position
                    newest = max(newest, position)
            return newest
        finally:
            probe.unassign()

    def _read_lag(self) -> int:
        s = self._settings
        probe, partitions, marks = self._offsets()
        if not partitions:
            return 0
        committed = probe.committed(
            [TopicPartition(t, p) for t, p in partitions], timeout=s.request_timeout_ms / 1000
        )
        done = {(tp.topic, tp.partition): tp.offset for tp in committed}
        lag = 0
        for partition in partitions:
            begin, end = marks[partition]
            mark = done.get(partition, -1)
            lag += max(0, end - max(mark if mark >= 0 else begin, begin))
        return lag

    def _close_probe(self) -> None:
        probe, self._probe = self._probe, None
        try:
            if probe is not None:
                probe.close()
        except Exception:
            log.debug("closing the Kafka probe consumer failed", exc_info=True)

    def _unavailable(self, operation: str, exc: Exception) -> DependencyUnavailable:
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        retriable = (
            bool(error.retriable() or error.code() < 0) if isinstance(error, KafkaError) else True
        )
        return DependencyUnavailable(
            "kafka",
            f"{operation} failed: {error.str() if isinstance(error, KafkaError) else exc}",
            {
                "bootstrap_servers": self._settings.bootstrap_servers,
                "group_id": self._settings.group_id,
                "retriable": retriable,
            },
        )
