-- ChonkyDB's async bulk jobs (`POST /v1/external/records/bulk` with execution_mode
-- async, `GET /v1/external/jobs/{id}`): in the database, so that any query worker
-- answers a job another accepted, and finished jobs outlive restarts. Bounded per
-- tenant (namespace) by `seq`: one tenant's jobs never push out another's.
CREATE TABLE IF NOT EXISTS chonkydb_jobs (
    job_id       TEXT PRIMARY KEY,
    tenant       TEXT             NOT NULL,
    owner        TEXT             NOT NULL,
    status       TEXT             NOT NULL,
    items        INTEGER          NOT NULL,
    result_json  JSONB,
    error        TEXT,
    document_ids JSONB            NOT NULL,
    seq          BIGINT           NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS chonkydb_jobs_tenant ON chonkydb_jobs (tenant, seq);
