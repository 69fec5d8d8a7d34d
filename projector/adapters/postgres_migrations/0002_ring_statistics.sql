-- Ring statistics per generation in server mode (projector/adapters/postgres_ring_stats.py;
-- issue 12): the same layout as the SQLite tables (projector/adapters/sqlite_ring_stats.py).
-- ring_members: per generation and document, the revision last applied, whether it was
-- a delete, and the document's galaxy, ring and float32 vector (what to subtract when it
-- changes or leaves); ring_stats: per generation, galaxy and ring, the live documents and
-- the float64 sums of their vectors and unit vectors. Query workers read ring_stats
-- (query/adapters/postgres_ring_stats.py).
CREATE TABLE ring_members (
    generation_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    revision      BIGINT NOT NULL,
    deleted       BOOLEAN NOT NULL,
    galaxy        TEXT NOT NULL,
    ring          TEXT NOT NULL,
    vector        BYTEA,
    PRIMARY KEY (generation_id, document_id)
);
CREATE TABLE ring_stats (
    generation_id TEXT NOT NULL,
    galaxy        TEXT NOT NULL,
    ring          TEXT NOT NULL,
    documents     BIGINT NOT NULL,
    vector_sum    BYTEA NOT NULL,
    unit_sum      BYTEA NOT NULL,
    PRIMARY KEY (generation_id, galaxy, ring)
);
