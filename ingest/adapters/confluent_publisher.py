"""Kafka side of the outbox relay on confluent-kafka (librdkafka, compiled).

The same wire format as `ingest.adapters.kafka_publisher` (`ingest.adapters.kafka_wire`
describes it): a projector reads what either publisher wrote, and both put a document's
events on the same partition. Here the per-event work (partitioning, batching,
compression of nothing, CRC, acknowledgements) runs in librdkafka's threads, in C: the
Python side is one `produce` call per row and one delivery report per row (where the
row landed: its partition and offset, recorded with the outbox mark).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from contracts.errors import DependencyUnavailable
from contracts.events import topic_for
from ingest.adapters.kafka_wire import KafkaPublisherSettings, headers_of, unreachable
from ingest.relay_ports import OutboxRow, Placement

__all__ = ["ConfluentEventPublisher", "KafkaPublisherSettings"]

log = logging.getLogger("orrery.relay")


class _PublishFailed(Exception):
    """One attempt failed; `retriable` says whether another attempt may succeed."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


def _failed(error: KafkaError, what: str) -> _PublishFailed:
    # A fatal error (the idempotent producer's state is lost) needs a new producer, which
    # the next attempt gets: retriable for this publish, as a transient one is.
    return _PublishFailed(
        f"{what}: {error.str()} ({error.name()})",
        retriable=bool(error.retriable() or error.fatal() or error.code() < 0),
    )


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, _PublishFailed) and exc.retriable


class ConfluentEventPublisher:
    """`EventPublisher` over librdkafka's producer (idempotent, `acks=all`).

    Guarantees (those of `KafkaEventPublisher`, which the conformance suite checks for
    both):
    - `publish` returns only when the broker acknowledged every row (all in-sync
      replicas): librdkafka's `flush` waits until every message was delivered or failed,
      and a failed one reports its error; on failure it retries transient errors with
      bounded exponential backoff, then raises `DependencyUnavailable("kafka", ...)`. A
      failed attempt drops its producer (what it still queued is purged) and the next
      attempt resends every row: a row may reach the log twice, never zero times once
      `publish` returned (at-least-once).
    - Rows of one document keep their order: same key, same partition (librdkafka's
      `murmur2_random` partitioner is Kafka's default for a key, so kafka-python's
      publisher and this one agree), and the idempotent producer keeps order within a
      partition across its own retries.
    - Topics are created with `partitions` partitions before the first send to them
      (an existing topic is fine); the producer never auto-creates topics.
    - `publish` returns each row's (partition, offset) from its delivery report (one
      Python call per row: the placement readiness counts by, see `relay_ports`).
    - No network I/O before the first `publish`: a relay can start while Kafka is down.

    Not thread-safe: one relay thread publishes.
    """

    def __init__(self, settings: KafkaPublisherSettings) -> None:
        self._settings = settings
        self._producer: Any = None
        self._admin: Any = None
        self._topics: set[str] = set()
        self._errors: list[tuple[KafkaError, Any]] = []
        self._lock = threading.Lock()

    def publish(self, rows: Sequence[OutboxRow]) -> list[Placement]:
        if not rows:
            return []
        s = self._settings
        retrying = Retrying(
            stop=stop_after_attempt(max(1, s.attempts)),
            wait=wait_exponential(multiplier=s.backoff_initial_s, max=s.backoff_max_s),
            retry=retry_if_exception(_retriable),
            reraise=True,
        )
        placements: list[Placement] = []
        try:
            with self._lock:
                for attempt in retrying:
                    with attempt:
                        placements = self._publish_once(rows)
        except _PublishFailed as exc:
            raise DependencyUnavailable(
                "kafka",
                f"could not publish {len(rows)} outbox events: {exc}",
                {
                    "bootstrap_servers": s.bootstrap_servers,
                    "first_position": rows[0].position,
                    "last_position": rows[-1].position,
                    "retriable": exc.retriable,
                },
            ) from exc
        return placements

    def close(self) -> None:
        with self._lock:
            self._discard_clients()

    def _publish_once(self, rows: Sequence[OutboxRow]) -> list[Placement]:
        s = self._settings
        try:
            producer = self._connected_producer()
            topics = {ns: topic_for(s.topic_prefix, ns) for ns in {row.namespace for row in rows}}
            self._ensure_topics(set(topics.values()))
            self._errors.clear()
            produce = producer.produce
            placed: list[Placement | None] = [None] * len(rows)
            for index, row in enumerate(rows):
                topic, key = topics[row.namespace], row.document_id.encode()
                value, headers = row.event_json.encode(), headers_of(row)
                on_delivery = self._placement_callback(placed, index)
                while True:
                    try:
                        produce(topic, value, key, headers=headers, on_delivery=on_delivery)
                        break
                    except BufferError:
                        # The local queue is full: serve delivery reports until it drains.
                        producer.poll(0.05)
            # Every message ends delivered or failed by its message timeout (=
            # ack_timeout_ms), so this flush normally returns with nothing left.
            left = producer.flush(s.ack_timeout_ms / 1000 + 5.0)
            if self._errors:
                error, message = self._errors[0]
                raise _failed(error, f"delivery to {message.topic()} failed")
            if left:
                raise _PublishFailed(f"no acknowledgement for {left} events", retriable=True)
            placements = [p for p in placed if p is not None]
            if len(placements) < len(rows):
                raise _PublishFailed("a delivery report is missing", retriable=True)
            return placements
        except KafkaException as exc:
            self._discard_clients()
            raise _failed(exc.args[0], "publish failed") from exc
        except _PublishFailed:
            self._discard_clients()
            raise

    def _placement_callback(
        self, placed: list[Placement | None], index: int
    ) -> Callable[[KafkaError | None, Any], None]:
        """The delivery report of row `index`: its (partition, offset), or its error."""

        def delivered(error: KafkaError | None, message: Any) -> None:
            # Called from `poll` / `flush` in this thread, once per message.
            if error is not None:
                self._errors.append((error, message))
            else:
                placed[index] = (int(message.partition()), int(message.offset()))

        return delivered

    def _connected_producer(self) -> Any:
        if self._producer is None:
            s = self._settings
            reason = unreachable(s.bootstrap_servers, s.connect_timeout_s)
            if reason is not None:
                raise _PublishFailed(f"no bootstrap server reachable ({reason})", retriable=True)
            self._producer = Producer(
                {
                    "bootstrap.servers": s.bootstrap_servers,
                    "client.id": s.client_id,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": s.linger_ms,
                    "batch.size": s.batch_size_bytes,
                    "request.timeout.ms": s.request_timeout_ms,
                    "message.timeout.ms": max(s.ack_timeout_ms, s.linger_ms + 1),
                    "socket.connection.setup.timeout.ms": s.bootstrap_timeout_ms,
                    # Kafka's default partitioner for a key (what kafka-python's does).
                    "partitioner": "murmur2_random",
                    "allow.auto.create.topics": False,
                    "logger": log,
                }
            )
        return self._producer

    def _ensure_topics(self, topics: set[str]) -> None:
        s = self._settings
        missing = sorted(topics - self._topics)
        if not missing:
            return
        if self._admin is None:
            config: dict[str, Any] = {
                "bootstrap.servers": s.bootstrap_servers,
                "client.id": f"{s.client_id}-admin",
                "socket.connection.setup.timeout.ms": s.bootstrap_timeout_ms,
                "logger": log,
            }
            self._admin = AdminClient(config)
        futures = self._admin.create_topics(
            [NewTopic(t, s.partitions, s.replication_factor) for t in missing],
            operation_timeout=s.request_timeout_ms / 1000,
            request_timeout=s.request_timeout_ms / 1000,
        )
        for topic, future in futures.items():
            try:
                future.result(timeout=s.request_timeout_ms / 1000 + 5.0)
                log.info("created topic %s with %d partitions", topic, s.partitions)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            except TimeoutError as exc:
                raise _PublishFailed(f"creating topic {topic} timed out", retriable=True) from exc
            self._topics.add(topic)

    def _discard_clients(self) -> None:
        producer, self._producer = self._producer, None
        self._admin = None  # librdkafka closes a client when its last reference goes
        self._topics.clear()  # a topic deleted meanwhile is created again on the next try
        if producer is not None:
            try:
                # What the failed attempt still queued is resent by the next one.
                producer.purge()
                producer.flush(0)
            except Exception:
                log.warning("purging the Kafka producer failed", exc_info=True)
