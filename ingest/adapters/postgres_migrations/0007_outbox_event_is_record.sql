-- An outbox row's event is its record row's (`contracts.events.OUTBOX_EVENT_IS_RECORD`,
-- an empty text; the relay reads the event from `records` by document_id and revision),
-- as in SQLite: a record's JSON is written once. Rows written before keep their whole
-- event and are relayed as written. The column is renamed so that a role from before
-- this migration fails closed rather than publish an empty event: its relay's claim and
-- its ingest API's COPY name `event_json`, which no longer exists (an error, retried;
-- nothing is written or marked). Renaming is a catalog change: instant with rows in the
-- table, lz4 compression (0002) kept.
ALTER TABLE outbox RENAME COLUMN event_json TO own_event_json;
