"""The two Kafka clients every Kafka test runs over: one factory each for the relay's
publisher and the projector's event log, by client name (`ORRERY_KAFKA_CLIENT`)."""

from __future__ import annotations

from typing import Any

from ingest.adapters.kafka_wire import KafkaPublisherSettings
from projector.adapters.kafka_wire import KafkaLogSettings

KAFKA_CLIENTS = ("confluent", "kafka-python")


def make_publisher(client: str, settings: KafkaPublisherSettings) -> Any:
    if client == "confluent":
        from ingest.adapters.confluent_publisher import ConfluentEventPublisher

        return ConfluentEventPublisher(settings)
    from ingest.adapters.kafka_publisher import KafkaEventPublisher

    return KafkaEventPublisher(settings)


def make_log(client: str, settings: KafkaLogSettings) -> Any:
    if client == "confluent":
        from projector.adapters.confluent_log import ConfluentEventLog

        return ConfluentEventLog(settings)
    from projector.adapters.kafka_log import KafkaEventLog

    return KafkaEventLog(settings)
