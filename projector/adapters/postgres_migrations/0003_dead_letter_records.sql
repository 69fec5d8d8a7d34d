-- Dead letters of records the projector could not apply (issue 22) name their record,
-- so that they are listed per namespace and re-driven; undecodable messages leave NULLs.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS namespace TEXT;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS snapshot_kind TEXT;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS document_id TEXT;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS revision BIGINT;
CREATE INDEX IF NOT EXISTS dead_letters_by_scope ON dead_letters (namespace, snapshot_kind);
