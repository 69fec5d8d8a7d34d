-- The newest Kafka offset the projector applied per (namespace, partition of its topic),
-- stored with its batch. Offsets strictly increase within a partition (whichever relay
-- published), so with the partition and offset the relay records on each outbox row
-- (ingest's migration 0006) a namespace's unapplied events are counted exactly, even when
-- a later event on another partition was applied first.
CREATE TABLE projector_partition_offsets (
    namespace       TEXT        NOT NULL,
    kafka_partition INTEGER     NOT NULL,
    kafka_offset    BIGINT      NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, kafka_partition)
);
