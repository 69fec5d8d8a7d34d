"""The only module of ingest that picks adapters."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.ports import RecordStore
from ingest.relay import relay_outbox

__all__ = ["canonical_db_path", "embedded_store", "kafka_relay_step"]


def canonical_db_path(data_dir: Path) -> Path:
    return data_dir / "orrery.sqlite"


def embedded_store(data_dir: Path) -> RecordStore:
    """The canonical store of the embedded deployment: SQLite with its outbox."""
    return SqliteRecordStore(canonical_db_path(data_dir))


def kafka_relay_step(
    data_dir: Path,
    *,
    bootstrap_servers: str,
    topic_prefix: str,
    partitions: int,
    batch_size: int,
) -> tuple[Callable[[], int], Callable[[], None]]:
    """One relay step (outbox → Kafka) and the function that closes its resources."""
    # Imported here: the embedded deployment never loads the Kafka client.
    from ingest.adapters.kafka_publisher import KafkaEventPublisher, KafkaPublisherSettings
    from ingest.adapters.sqlite_outbox_relay import SqliteOutboxReader

    source = SqliteOutboxReader(canonical_db_path(data_dir))
    publisher = KafkaEventPublisher(
        KafkaPublisherSettings(
            bootstrap_servers=bootstrap_servers,
            topic_prefix=topic_prefix,
            partitions=partitions,
        )
    )
    step = functools.partial(
        relay_outbox, source=source, publisher=publisher, batch_size=batch_size, max_batches=20
    )

    def close() -> None:
        publisher.close()
        source.close()

    return step, close
