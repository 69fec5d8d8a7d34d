-- Every statement that writes what a namespace's backlog is counted from (the newest
-- applied position per namespace and per partition, the log's measured lag) notifies
-- channel `orrery_projected` (delivered at commit, once per transaction), so a paced
-- writer in the ingest API re-reads its namespace's backlog when the projector moved
-- instead of every 50 ms while it waits (issue 24, target 4: those reads were most of
-- the ingest API's calls and of the database's transactions under flat-out POSTs).
-- Writers from before it ignore the notifications and keep polling.
CREATE FUNCTION orrery_projected_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('orrery_projected', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER projected_notify_positions AFTER INSERT OR UPDATE ON projector_namespace_positions
    FOR EACH STATEMENT EXECUTE FUNCTION orrery_projected_notify();
CREATE TRIGGER projected_notify_offsets AFTER INSERT OR UPDATE ON projector_partition_offsets
    FOR EACH STATEMENT EXECUTE FUNCTION orrery_projected_notify();
CREATE TRIGGER projected_notify_status AFTER INSERT OR UPDATE ON projector_log_status
    FOR EACH STATEMENT EXECUTE FUNCTION orrery_projected_notify();
