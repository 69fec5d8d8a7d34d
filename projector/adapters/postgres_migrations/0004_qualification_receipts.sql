-- Qualification receipts of sharded or replicated generations (issue 23,
-- contracts/qualification.py): immutable, content-addressed (receipt_id = sha256 of the
-- receipt's canonical JSON), bound to the descriptor digest they qualified. The same
-- layout as the SQLite table (projector/adapters/sqlite_state.py).
CREATE TABLE qualification_receipts (
    receipt_id        TEXT PRIMARY KEY,
    generation_id     TEXT NOT NULL,
    descriptor_digest TEXT NOT NULL,
    passed            BOOLEAN NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL,
    receipt_json      TEXT NOT NULL
);
CREATE INDEX qualification_receipts_by_generation
    ON qualification_receipts (generation_id, created_at);
