-- Record JSON (with its vector, a few KB) is stored twice per write: records.record_json
-- and outbox.event_json, both TOASTed. pglz compression of them was most of the
-- database's CPU for an ingest; lz4 costs about a fifth of it (a slightly larger table).
-- Only new values are compressed with lz4. A server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE records ALTER COLUMN record_json SET COMPRESSION lz4;
    ALTER TABLE outbox ALTER COLUMN event_json SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'PostgreSQL without lz4: record JSON stays pglz-compressed';
END
$$;
