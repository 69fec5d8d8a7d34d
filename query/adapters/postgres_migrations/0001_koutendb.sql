-- The KoutenDB envelope's query-side state in server mode
-- (query/adapters/postgres_koutendb.py): search profiles per namespace and the kept
-- envelopes (about one day of requests, with their feedback). Same layout as
-- DATA_DIR/koutendb.sqlite (query/adapters/sqlite_koutendb.py), except created_at is a
-- TIMESTAMPTZ.
CREATE TABLE kouten_profiles (
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    amount    TEXT NOT NULL,
    scope     TEXT NOT NULL,
    depth     TEXT NOT NULL,
    note      TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE TABLE kouten_envelopes (
    request_id   TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    galaxy       TEXT NOT NULL,
    base_ring    TEXT NOT NULL,
    profile      TEXT NOT NULL,
    budget       INTEGER NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    chunks_json  TEXT NOT NULL,
    used_json    TEXT,
    ignored_json TEXT
);
CREATE INDEX kouten_envelopes_by_galaxy ON kouten_envelopes (namespace, galaxy, created_at);
CREATE INDEX kouten_envelopes_by_age ON kouten_envelopes (created_at);
