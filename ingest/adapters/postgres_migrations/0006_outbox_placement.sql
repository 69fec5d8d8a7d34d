-- Where the relay published each outbox row: its partition of the namespace's topic and
-- its offset there (NULL: not published yet, published before this migration, or on a
-- log without partitions). Readiness and pacing count a namespace's unapplied events per
-- partition against the projector's applied offsets (`projector_partition_offsets`).
ALTER TABLE outbox ADD COLUMN kafka_partition integer;
ALTER TABLE outbox ADD COLUMN kafka_offset bigint;
-- Per partition, the rows above an applied offset (and the newest partition, one probe).
CREATE INDEX outbox_by_placement ON outbox (namespace, kafka_partition, kafka_offset)
    WHERE kafka_partition IS NOT NULL;
-- A namespace's rows not published yet, without reading other namespaces' backlog.
CREATE INDEX outbox_unpublished_by_namespace ON outbox (namespace, position)
    WHERE published_at IS NULL;
