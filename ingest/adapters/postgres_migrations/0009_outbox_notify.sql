-- Every statement that inserts outbox rows notifies channel `orrery_outbox` (delivered at
-- commit, once per transaction: PostgreSQL folds equal notifications of a transaction),
-- so a relay in another process wakes when rows are there instead of claiming an empty
-- outbox every 200 ms (issue 24, target 4: an idle relay's claims were most of its
-- calls; `ingest.adapters.postgres_outbox_relay.PostgresOutboxSignal` listens). Roles
-- from before it ignore the notifications and keep polling.
CREATE FUNCTION orrery_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('orrery_outbox', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION orrery_outbox_notify();
