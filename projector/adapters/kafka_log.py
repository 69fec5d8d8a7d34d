"""The server-mode event log: the relay's Kafka topics, read in a consumer group.

Reads what `ingest.adapters.kafka_publisher` writes: one topic per namespace named
`topic_for(topic_prefix, namespace)` (`{prefix}.{namespace_token}`), key = document id,
value = `RecordChanged` JSON (which names the namespace), header
`orrery-position` = the outbox position in ASCII digits.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from contracts.errors import DependencyUnavailable, OrreryError
from contracts.events import LogEntry
from projector.adapters.kafka_wire import (
    POSITION_HEADER,
    Delivered,
    GroupEventLog,
    KafkaLogSettings,
    decode_message,
    position_of,
    unreachable,
)
from projector.ports import Undecodable

with warnings.catch_warnings():
    # kafka-python 3.0 loads its protocol schemas with importlib.resources.read_text and
    # open_text, deprecated since Python 3.11: harmless, but fatal under `-W error`.
    warnings.filterwarnings(
        "ignore",
        category=DeprecationWarning,
        message=r"\w+ is deprecated\. Use files\(\) instead",
    )
    from kafka import KafkaAdminClient, KafkaConsumer
    from kafka.errors import IllegalStateError, KafkaError, KafkaTimeoutError
    from kafka.net.compat import KafkaNetClient
    from kafka.structs import MemberState, OffsetAndMetadata, TopicPartition

__all__ = ["POSITION_HEADER", "KafkaEventLog", "KafkaLogSettings"]

log = logging.getLogger("orrery.projector")
# Pause between polls that return nothing while this member is not stable in its group.
_REJOIN_PAUSE_S = 0.02


def _decode(record: Any) -> LogEntry | Undecodable:
    return decode_message(
        record.topic, record.partition, record.offset, record.key, record.value, record.headers
    )


def _position(record: Any) -> int:
    return position_of(record.headers, record.topic, record.partition, record.offset)


def _construct(factory: Callable[..., Any], **config: Any) -> Any:
    """Build a kafka-python client; if its bootstrap fails, close what it already opened."""
    made: list[Any] = []

    def net_client(**kwargs: Any) -> Any:
        client = KafkaNetClient(**kwargs)
        made.append(client)
        return client

    try:
        return factory(kafka_client=net_client, **config)
    except BaseException:
        for client in made:
            try:
                client.close()
            except Exception:  # best effort: the original error is the one to report
                log.debug("closing a half-built Kafka client failed", exc_info=True)
        raise


def _keep_joining(consumer: Any) -> None:
    """Make the next `poll` of a member that is not stable (re)join its group.

    kafka-python 3.0.12 (`BaseCoordinator.join_group_async`) runs JoinGroup → SyncGroup as
    a task on its IO thread but applies the outcome (state STABLE, heartbeats on, the
    assignment) only in a `poll` that waits for that task, and only while
    `need_rejoin()` holds. The task itself already records what `need_rejoin()` compares
    when a rejoin is due to a subscription or metadata change (a pattern subscription
    taking a new topic): the subscription it joined with (`group_protocols`) and, as
    leader, the metadata it assigned (`_perform_assignment`). A join that completes while
    no poll waits — the poll that started it timed out — therefore leaves the member
    `rebalancing` with `need_rejoin()` false: no later poll joins or applies anything,
    `poll` spins without a wait, heartbeats stay off, and the broker drops the member
    after its session timeout (the CI failure of session 23; the 60 s stalls of sessions
    16-17). A requested rejoin makes the next poll await a join still in flight, or send
    a new one in place of a completed one.
    """
    consumer._coordinator.request_rejoin()


class KafkaEventLog(GroupEventLog):
    """`EventLog` over the relay's topics, read by one member of a Kafka consumer group.

    Guarantees:
    - `fetch` returns events of the partitions this member owns, each partition in
      offset order, so every document's events keep the relay's (position) order; across
      documents there is no order. It waits up to `poll_timeout_ms` when nothing is
      waiting, and returns as many waiting events as it can, up to `limit`: an empty
      list means none was waiting for this member.
    - Offsets are committed only by `acknowledge` (no auto-commit), synchronously; per
      partition the commit never passes an event that was delivered and not yet
      acknowledged; acknowledgements may come in any order (one held back by an older
      pending event is committed with it). `close` commits nothing.
    - `reset` moves every owned partition back to its committed offset, so the next
      `fetch` delivers the unacknowledged events again. After a restart, a rebalance, or
      a failed `fetch` the same happens by itself (at-least-once).
    - `high_water` reads the newest position on the log: the largest `orrery-position`
      among the last record of every partition of every matching topic (0 when they
      are all empty). The relay publishes in position order, so that is exact once the
      relay caught up; while it is still re-sending after a failure it may lag behind.
    - `lag` is the consumer group's lag: over every partition of every matching topic
      (not only this member's), end offset minus the group's committed offset (the
      beginning offset where it committed none). The group commits only acknowledged
      events, so 0 means every event appended before the call was acknowledged (applied
      or parked).
    - Errors of the client become `DependencyUnavailable("kafka", ...)`; a record that
      cannot be decoded (no or a bad `orrery-position` header, a value that is not a
      `RecordChanged`) is returned as an `Undecodable` in its place, with its raw key,
      value and headers; it holds its partition's commit back until acknowledged.
    - No network I/O before the first call; new namespaces are picked up within
      `metadata_max_age_ms`, or on the next `fetch` once `lag` or `high_water` saw
      their topic.
    - A member that is not stable within `join_timeout_ms` is dropped (closed, leaving
      the group); the next `fetch` joins with a new consumer from the committed offsets.

    Not thread-safe for `fetch` / `acknowledge` / `reset` (one projector thread);
    `high_water` and `lag` may run in another thread (they use their own clients).
    """

    driver_errors = (KafkaError,)

    def __init__(self, settings: KafkaLogSettings) -> None:
        super().__init__(settings)
        self._admin: Any = None

    # -- EventLog ------------------------------------------------------------------------

    def acknowledge(self, entries: Sequence[LogEntry | Undecodable]) -> None:
        if not entries:
            return
        with self._lock:
            if self._consumer is None:
                return
            consumer = self._consumer
            try:
                offsets = self._ledger.commit_offsets(
                    self._ledger.take(entries), consumer.assignment()
                )
                if offsets:
                    consumer.commit(
                        offsets={
                            TopicPartition(*partition): OffsetAndMetadata(offset, "", epoch)
                            for partition, (offset, epoch) in offsets.items()
                        },
                        timeout_ms=self._settings.request_timeout_ms,
                    )
            except KafkaError as exc:
                # Nothing of these was committed and the ledger let them go: the next
                # fetch goes back to the committed offsets, so they are delivered again.
                self._rewind_due = True
                raise self._unavailable("acknowledge", exc) from exc

    # -- fetch ---------------------------------------------------------------------------

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
                consumer = _construct(
                    KafkaConsumer,
                    bootstrap_servers=s.bootstrap_servers,
                    client_id=s.client_id,
                    group_id=s.group_id,
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    session_timeout_ms=s.session_timeout_ms,
                    heartbeat_interval_ms=s.heartbeat_interval_ms,
                    max_poll_interval_ms=s.max_poll_interval_ms,
                    metadata_max_age_ms=s.metadata_max_age_ms,
                    request_timeout_ms=s.request_timeout_ms,
                    bootstrap_timeout_ms=s.bootstrap_timeout_ms,
                    check_crcs=s.check_crcs,
                )
            except KafkaError as exc:
                raise self._unavailable("connect", exc) from exc
            try:
                consumer.subscribe(pattern=s.topic_pattern)
            except BaseException:
                consumer.close(autocommit=False)
                raise
            self._consumer = consumer
        return self._consumer

    def _fetch(self, consumer: Any, limit: int) -> list[LogEntry | Undecodable]:
        s = self._settings
        self._refresh_topics(consumer)
        deadline = time.monotonic() + s.join_timeout_ms / 1000
        out: list[LogEntry | Undecodable] = []
        while len(out) < limit:
            timeout_ms = s.poll_timeout_ms
            if consumer.group_metadata().state != MemberState.STABLE:
                # kafka-python 3.0 applies a completed JoinGroup/SyncGroup only while a
                # poll waits for it: one that completed between polls (during our batch,
                # the pause below, or the metadata refresh a pattern subscription makes
                # at the start of every poll) is lost, and without `_keep_joining` no
                # later poll would even join again. Short polls rarely catch a leader's
                # join (the stalled rebalances of sessions 16-17): while joining, one
                # poll waits across the whole rebalance.
                _keep_joining(consumer)
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                timeout_ms = max(s.poll_timeout_ms, min(s.session_timeout_ms, remaining_ms))
            batch = consumer.poll(timeout_ms=timeout_ms, max_records=limit - len(out))
            out.extend(self._deliver(batch))
            if len(out) >= limit:
                break
            if consumer.group_metadata().state != MemberState.STABLE:
                if time.monotonic() < deadline:
                    if not batch:
                        # A poll during a rebalance can return at once: without a pause
                        # this loop spins and starves the client's network thread (the
                        # GIL), which then misses the join (seen: 60 s rebalances).
                        time.sleep(_REJOIN_PAUSE_S)
                    continue  # each poll drives the join
                if out:
                    break
                state = consumer.group_metadata().state
                log.warning(
                    "not a stable member of group %r after %d ms (state %s): "
                    "leaving it; the next fetch joins as a new member",
                    s.group_id,
                    s.join_timeout_ms,
                    state,
                )
                self._drop(consumer)
                raise KafkaTimeoutError(
                    f"not a stable member of group {s.group_id!r} after {s.join_timeout_ms} ms"
                    f" (state {state}); the consumer was replaced"
                )
            if not self._waiting(consumer) or time.monotonic() >= deadline:
                break
        return out

    def _refresh_topics(self, consumer: Any) -> None:
        """Refresh the topic metadata when the probe saw a matching topic this member is
        not subscribed to: the pattern subscription then takes it (a rebalance) instead of
        waiting for the periodic metadata refresh."""
        unseen = self._probed_topics - set(consumer.subscription() or ())
        now = time.monotonic()
        if not unseen or now < self._next_topic_refresh:
            return
        self._next_topic_refresh = now + self._settings.topic_refresh_ms / 1000
        log.info("new topics %s: refreshing the consumer's metadata", sorted(unseen))
        consumer.topics()

    def _deliver(self, batch: Mapping[Any, Sequence[Any]]) -> list[LogEntry | Undecodable]:
        return self._ledger.deliver(
            Delivered(
                entry=_decode(record),
                partition=TopicPartition(record.topic, record.partition),
                offset=record.offset,
                leader_epoch=-1 if record.leader_epoch is None else record.leader_epoch,
            )
            for records in batch.values()
            for record in records
        )

    def _waiting(self, consumer: Any) -> bool:
        """Whether an owned partition holds records this member has not returned yet."""
        assigned = list(consumer.assignment())
        if not assigned:
            return False
        timeout_ms = self._settings.request_timeout_ms
        positions: dict[Any, int | None] = {}
        for partition in assigned:
            try:
                positions[partition] = consumer.position(partition, timeout_ms=timeout_ms)
                # The last fetch response's high watermark answers "yes" without a round trip.
                known_end = consumer.highwater(partition)
            except IllegalStateError:
                return True  # revoked while we looked: poll again
            position = positions[partition]
            if position is None or (known_end is not None and position < known_end):
                return True
        ends = consumer.end_offsets(assigned, timeout_ms=timeout_ms)
        return any(
            position is None or position < ends.get(partition, 0)
            for partition, position in positions.items()
        )

    # -- acknowledge / reset --------------------------------------------------------------

    def _rewind(self, consumer: Any) -> None:
        self._ledger.clear()
        timeout_ms = self._settings.request_timeout_ms
        for partition in consumer.assignment():
            committed = consumer.committed(partition, timeout_ms=timeout_ms)
            try:
                if committed is None:
                    consumer.seek_to_beginning(partition)
                else:
                    consumer.seek(partition, committed)
            except ValueError:
                continue  # revoked meanwhile: its next owner starts at the committed offset

    def _forget_membership(self) -> None:
        """kafka-python keeps a member's state in the consumer alone."""

    def _close_consumer(self, consumer: Any) -> None:
        consumer.close(autocommit=False, timeout_ms=self._settings.request_timeout_ms)

    # -- high_water -----------------------------------------------------------------------

    def _offsets(self) -> tuple[Any, Any, list[Any], dict[Any, int], dict[Any, int]]:
        """The probe clients, every matching partition, and their begin and end offsets."""
        timeout_ms = self._settings.request_timeout_ms
        admin, probe = self._probe_clients()
        partitions = self._matching_partitions(admin)
        if not partitions:
            return admin, probe, [], {}, {}
        begins = probe.beginning_offsets(partitions, timeout_ms=timeout_ms)
        ends = probe.end_offsets(partitions, timeout_ms=timeout_ms)
        return admin, probe, partitions, begins, ends

    def _read_high_water(self) -> int:
        s = self._settings
        _, probe, partitions, begins, ends = self._offsets()
        last = {tp: ends[tp] - 1 for tp in partitions if ends[tp] > begins[tp]}
        if not last:
            return 0
        probe.assign(list(last))
        for partition, offset in last.items():
            probe.seek(partition, offset)
        newest = 0
        remaining = set(last)
        deadline = time.monotonic() + s.request_timeout_ms / 1000
        while remaining:
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(f"could not read the last record of {sorted(remaining)}")
            for records in probe.poll(timeout_ms=s.poll_timeout_ms).values():
                for record in records:
                    remaining.discard(TopicPartition(record.topic, record.partition))
                    with contextlib.suppress(OrreryError):  # undecodable: it has no position
                        newest = max(newest, _position(record))
        return newest

    def _matching_partitions(self, admin: Any) -> list[Any]:
        topics = [
            topic
            for topic in admin.describe_topics()
            if topic.get("error_code", 0) == 0 and self._pattern.match(topic["name"])
        ]
        self._probed_topics = frozenset(topic["name"] for topic in topics)
        return [
            TopicPartition(topic["name"], p["partition_index"])
            for topic in topics
            for p in topic.get("partitions", ())
        ]

    def _read_lag(self) -> int:
        s = self._settings
        admin, _, partitions, begins, ends = self._offsets()
        if not partitions:
            return 0
        committed = admin.list_group_offsets({s.group_id: None}).get(s.group_id, {})
        lag = 0
        for partition in partitions:
            mark = committed.get(partition)
            done = mark.offset if mark is not None and mark.offset >= 0 else begins[partition]
            lag += max(0, ends[partition] - max(done, begins[partition]))
        return lag

    def _probe_clients(self) -> tuple[Any, Any]:
        if self._closed:
            raise DependencyUnavailable("kafka", "the event log is closed")
        s = self._settings
        if self._admin is None or self._probe is None:
            self._close_probe()
            reason = unreachable(s.bootstrap_servers, s.connect_timeout_s)
            if reason is not None:
                raise DependencyUnavailable(
                    "kafka",
                    f"no bootstrap server reachable ({reason})",
                    {"bootstrap_servers": s.bootstrap_servers},
                )
            common = {
                "bootstrap_servers": s.bootstrap_servers,
                "request_timeout_ms": s.request_timeout_ms,
                "bootstrap_timeout_ms": s.bootstrap_timeout_ms,
            }
            self._admin = _construct(KafkaAdminClient, client_id=f"{s.client_id}-hw", **common)
            self._probe = _construct(
                KafkaConsumer,
                client_id=f"{s.client_id}-hw",
                group_id=None,
                enable_auto_commit=False,
                **common,
            )
        return self._admin, self._probe

    def _close_probe(self) -> None:
        probe, self._probe = self._probe, None
        admin, self._admin = self._admin, None
        try:
            if probe is not None:
                probe.close(autocommit=False)
        except Exception:
            log.debug("closing the Kafka probe consumer failed", exc_info=True)
        try:
            if admin is not None:
                admin.close()
        except Exception:
            log.debug("closing the Kafka admin client failed", exc_info=True)

    def _unavailable(self, operation: str, exc: Exception) -> DependencyUnavailable:
        return DependencyUnavailable(
            "kafka",
            f"{operation} failed: {exc}",
            {
                "bootstrap_servers": self._settings.bootstrap_servers,
                "group_id": self._settings.group_id,
                "retriable": bool(getattr(exc, "retriable", False)),
            },
        )
