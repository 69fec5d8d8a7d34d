-- The W3C traceparent of the request that wrote each outbox row (NULL: tracing was off).
-- The relay sends it as a Kafka header, so the projector's batch span links to the write.
ALTER TABLE outbox ADD COLUMN trace_context text;
