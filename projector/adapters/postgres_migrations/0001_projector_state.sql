-- The projector's bookkeeping in server mode (projector/adapters/postgres_state.py):
-- consumer positions, the generation registry, per-generation document revisions, live
-- pointers, evidence checks, log health, dead letters and the vector cache. Same layout
-- as the SQLite tables (projector/adapters/sqlite_state.py); query workers read it
-- (query/adapters/postgres_routing.py).
CREATE TABLE projector_positions (
    consumer   TEXT PRIMARY KEY,
    position   BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE generations (
    seq               BIGINT PRIMARY KEY,
    generation_id     TEXT UNIQUE NOT NULL,
    namespace         TEXT NOT NULL,
    snapshot_kind     TEXT NOT NULL,
    state             TEXT NOT NULL,
    descriptor_json   TEXT NOT NULL,
    document_count    BIGINT NOT NULL DEFAULT 0,
    applied_position  BIGINT NOT NULL DEFAULT 0,
    commit_seq        BIGINT NOT NULL DEFAULT 0,
    descriptor_digest TEXT NOT NULL DEFAULT '',
    heartbeat_at      TIMESTAMPTZ,
    indexes_dropped   BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX generations_scope ON generations (namespace, snapshot_kind, state);
CREATE TABLE live_pointers (
    namespace     TEXT NOT NULL,
    snapshot_kind TEXT NOT NULL,
    generation_id TEXT NOT NULL,
    switched_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, snapshot_kind)
);
CREATE TABLE generation_documents (
    generation_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    revision      BIGINT NOT NULL,
    deleted       BOOLEAN NOT NULL,
    PRIMARY KEY (generation_id, document_id)
);
-- seq: MAX + 1 under an advisory lock, so numbers appear in commit order.
CREATE TABLE generation_checks (
    seq           BIGINT PRIMARY KEY,
    generation_id TEXT NOT NULL,
    kind          TEXT NOT NULL,
    ok            BOOLEAN NOT NULL,
    checked_at    TIMESTAMPTZ NOT NULL,
    check_json    TEXT NOT NULL
);
CREATE INDEX generation_checks_by_generation ON generation_checks (generation_id, seq);
CREATE TABLE projector_log_status (
    consumer    TEXT PRIMARY KEY,
    position    BIGINT NOT NULL,
    lag_events  BIGINT NOT NULL,
    measured_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE dead_letters (
    seq           BIGSERIAL PRIMARY KEY,
    consumer      TEXT NOT NULL,
    location      TEXT NOT NULL,
    position      BIGINT,
    message_key   BYTEA,
    message_value BYTEA NOT NULL,
    headers_json  TEXT NOT NULL,
    reason        TEXT NOT NULL,
    parked_at     TIMESTAMPTZ NOT NULL,
    UNIQUE (consumer, location)
);
CREATE TABLE vector_cache (
    cache_key TEXT PRIMARY KEY,
    dimension INTEGER NOT NULL,
    vector    BYTEA NOT NULL
);
