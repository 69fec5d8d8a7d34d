-- A tenant's own log positions (issue 22): readiness shows a key its namespace's newest
-- position and its own unapplied events, never the global write counter.
CREATE INDEX outbox_by_namespace ON outbox (namespace, position);
