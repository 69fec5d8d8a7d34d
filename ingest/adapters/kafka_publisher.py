"""Kafka side of the outbox relay: publish outbox rows with kafka-python's producer.

Wire format (read by `projector.adapters.kafka_log`):

- topic: `contracts.events.topic_for` = `f"{topic_prefix}.{namespace_token(namespace)}"`,
  e.g. `orrery.records.demo`, created on first use with `partitions` partitions;
- key: the document id (UTF-8), so every event of a document goes to one partition and
  keeps its order there;
- value: the outbox row's `event_json` byte for byte, i.e. a `RecordChanged` JSON
  document, so outside readers see the contract event and nothing else;
- header `orrery-position`: the outbox position as ASCII decimal digits.

The position travels in a header rather than in a `LogEntry` wrapper so the value stays
the exact bytes the canonical store committed; the position is transport metadata, like
the Kafka offset next to it.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from contracts.errors import DependencyUnavailable
from contracts.events import topic_for
from ingest.adapters.kafka_wire import (
    KafkaPublisherSettings,
    headers_of,
    murmur2_many,
    unreachable,
)
from ingest.relay_ports import OutboxRow, Placement

with warnings.catch_warnings():
    # kafka-python 3.0 loads its protocol schemas with importlib.resources.read_text and
    # open_text, deprecated since Python 3.11: harmless, but fatal under `-W error`.
    warnings.filterwarnings(
        "ignore",
        category=DeprecationWarning,
        message=r"\w+ is deprecated\. Use files\(\) instead",
    )
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError
    from kafka.net.compat import KafkaNetClient

__all__ = ["KafkaEventPublisher", "KafkaPublisherSettings", "murmur2_many"]


log = logging.getLogger("orrery.relay")


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, KafkaError) and bool(exc.retriable)


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


class KafkaEventPublisher:
    """`EventPublisher` over kafka-python's `KafkaProducer` (idempotent, `acks="all"`).

    Guarantees:
    - `publish` returns only when every row's send future succeeded, i.e. all in-sync
      replicas acknowledged it; on failure it retries transient errors with bounded
      exponential backoff, then raises `DependencyUnavailable("kafka", ...)`. A failed
      attempt closes its producer (whatever it still buffered is sent or dropped before
      the next attempt starts) and the next attempt resends every row: a row may reach
      the log twice, never zero times once `publish` returned (at-least-once).
    - Rows of one document keep their order: same key, same partition, and the
      idempotent producer keeps order within a partition across its own retries.
    - Topics are created with `partitions` partitions before the first send to them
      (an existing topic is fine); the producer never auto-creates topics.
    - `publish` returns each row's (partition, offset) from its acknowledgement.
    - No network I/O before the first `publish`: a relay can start while Kafka is down.

    Not thread-safe: one relay thread publishes.
    """

    def __init__(self, settings: KafkaPublisherSettings) -> None:
        self._settings = settings
        self._producer: Any = None
        self._admin: Any = None
        self._topics: set[str] = set()
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
        except KafkaError as exc:
            raise DependencyUnavailable(
                "kafka",
                f"could not publish {len(rows)} outbox events: {exc}",
                {
                    "bootstrap_servers": s.bootstrap_servers,
                    "first_position": rows[0].position,
                    "last_position": rows[-1].position,
                    "retriable": bool(exc.retriable),
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
            self._ensure_topics(set(topics))
            keys = [row.document_id.encode() for row in rows]
            # The partition kafka-python's default partitioner picks for each key, hashed
            # for the whole batch at once (its murmur2 is pure Python, per key).
            partitions = _partitions(producer, [topics[row.namespace] for row in rows], keys)
            futures = [
                producer.send(
                    topics[row.namespace],
                    key=key,
                    value=row.event_json.encode(),
                    headers=headers_of(row),
                    partition=partition,
                )
                for row, key, partition in zip(rows, keys, partitions, strict=True)
            ]
            # Futures fail by themselves after the delivery timeout (= ack_timeout_ms),
            # so this flush normally returns with every future done.
            producer.flush(timeout=s.ack_timeout_ms / 1000 + 5.0)
            placements: list[Placement] = []
            for row, future in zip(rows, futures, strict=True):
                if not future.is_done:
                    raise KafkaConnectionError(f"no acknowledgement for position {row.position}")
                if future.exception is not None:
                    raise future.exception
                placements.append((int(future.value.partition), int(future.value.offset)))
            return placements
        except KafkaError:
            self._discard_clients()
            raise

    def _connected_producer(self) -> Any:
        if self._producer is None:
            s = self._settings
            reason = unreachable(s.bootstrap_servers, s.connect_timeout_s)
            if reason is not None:
                raise KafkaConnectionError(f"no bootstrap server reachable ({reason})")
            self._producer = _construct(
                KafkaProducer,
                bootstrap_servers=s.bootstrap_servers,
                client_id=s.client_id,
                acks="all",
                enable_idempotence=True,
                linger_ms=s.linger_ms,
                batch_size=s.batch_size_bytes,
                request_timeout_ms=s.request_timeout_ms,
                delivery_timeout_ms=max(s.ack_timeout_ms, s.linger_ms + s.request_timeout_ms),
                max_block_ms=s.ack_timeout_ms,
                bootstrap_timeout_ms=s.bootstrap_timeout_ms,
                allow_auto_create_topics=False,
                # Nothing reads the producer's own metrics; each send recorded several.
                metrics_enabled=False,
            )
        return self._producer

    def _ensure_topics(self, namespaces: set[str]) -> None:
        s = self._settings
        missing = {topic_for(s.topic_prefix, ns) for ns in namespaces} - self._topics
        for topic in sorted(missing):
            if self._admin is None:
                self._admin = _construct(
                    KafkaAdminClient,
                    bootstrap_servers=s.bootstrap_servers,
                    client_id=f"{s.client_id}-admin",
                    request_timeout_ms=s.request_timeout_ms,
                    bootstrap_timeout_ms=s.bootstrap_timeout_ms,
                )
            try:
                self._admin.create_topics(
                    {
                        topic: {
                            "num_partitions": s.partitions,
                            "replication_factor": s.replication_factor,
                        }
                    },
                    timeout_ms=s.request_timeout_ms,
                    wait_for_metadata=True,
                )
                log.info("created topic %s with %d partitions", topic, s.partitions)
            except TopicAlreadyExistsError:
                pass
            self._topics.add(topic)

    def _discard_clients(self) -> None:
        producer, self._producer = self._producer, None
        admin, self._admin = self._admin, None
        self._topics.clear()  # a topic deleted meanwhile is created again on the next try
        try:
            if producer is not None:
                producer.close(timeout=5.0)
        except Exception:  # kafka-python raises from close() while batches are pending
            log.warning("closing the Kafka producer failed", exc_info=True)
        try:
            if admin is not None:
                admin.close()
        except Exception:
            log.warning("closing the Kafka admin client failed", exc_info=True)


def _partitions(producer: Any, topics: Sequence[str], keys: Sequence[bytes]) -> list[int]:
    """Each key's partition of its topic as kafka-python's `DefaultPartitioner` picks it
    (`murmur2(key) & 0x7fffffff` modulo the topic's partition count, into its sorted
    partition ids), so a document's events go where they always went."""
    hashes = murmur2_many(keys)
    ids: dict[str, list[int]] = {}
    out: list[int] = []
    for topic, hashed in zip(topics, hashes.tolist(), strict=True):
        known = ids.get(topic)
        if known is None:
            known = ids[topic] = sorted(producer.partitions_for(topic))
        out.append(known[(hashed & 0x7FFFFFFF) % len(known)])
    return out
