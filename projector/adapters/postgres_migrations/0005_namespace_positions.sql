-- The newest log (outbox) position the projector applied per namespace (issue 22),
-- stored with its batch: server-mode ingest paces a namespace by its own backlog (its
-- outbox rows after this position), so one tenant's burst never slows another's writes.
CREATE TABLE projector_namespace_positions (
    namespace  TEXT        PRIMARY KEY,
    position   BIGINT      NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
-- A database that ran before this migration: every namespace counts as applied up to the
-- projector's position (else its old outbox rows would refuse its writes until a lag of
-- 0 is measured). Without the canonical store's outbox in this database, nothing to do.
DO $$
BEGIN
    IF to_regclass('outbox') IS NOT NULL THEN
        INSERT INTO projector_namespace_positions (namespace, position, updated_at)
        SELECT namespace, MAX(position), now() FROM outbox
        WHERE position <= (SELECT COALESCE(MAX(position), 0) FROM projector_positions)
        GROUP BY namespace;
    END IF;
END $$;
