-- The canonical store: every record revision, the head per document, the outbox.
-- Positions come from outbox_counter, a single row updated in the writing transaction
-- (see ingest/adapters/postgres_store.py): gap-free and in commit order.
CREATE TABLE records (
    document_id    TEXT        NOT NULL,
    revision       BIGINT      NOT NULL,
    namespace      TEXT        NOT NULL,
    snapshot_kind  TEXT        NOT NULL,
    item_id        TEXT        NOT NULL,
    galaxy         TEXT        NOT NULL,
    deleted        BOOLEAN     NOT NULL,
    payload_sha256 TEXT        NOT NULL,
    record_json    TEXT        NOT NULL,
    accepted_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (document_id, revision)
);
CREATE TABLE heads (
    document_id   TEXT PRIMARY KEY,
    revision      BIGINT  NOT NULL,
    namespace     TEXT    NOT NULL,
    snapshot_kind TEXT    NOT NULL,
    deleted       BOOLEAN NOT NULL
);
CREATE INDEX heads_scope ON heads (namespace, snapshot_kind, deleted);
CREATE TABLE outbox (
    position      BIGINT      PRIMARY KEY,
    document_id   TEXT        NOT NULL,
    revision      BIGINT      NOT NULL,
    namespace     TEXT        NOT NULL,
    snapshot_kind TEXT        NOT NULL,
    event_json    TEXT        NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    published_at  TIMESTAMPTZ
);
-- The relay reads unpublished rows in position order, and checks per document that no
-- older row of it is still unpublished (a row's claim waits for its predecessor).
CREATE INDEX outbox_unpublished ON outbox (position) WHERE published_at IS NULL;
CREATE INDEX outbox_unpublished_document ON outbox (document_id, position)
    WHERE published_at IS NULL;
CREATE TABLE outbox_counter (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    position  BIGINT  NOT NULL
);
INSERT INTO outbox_counter (singleton, position) VALUES (TRUE, 0);
