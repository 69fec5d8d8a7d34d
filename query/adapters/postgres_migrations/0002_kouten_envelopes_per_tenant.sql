-- Kept envelopes are keyed per tenant (issue 22): the same request id in two namespaces,
-- or two galaxies of one, names two envelopes (before, tenant B's request id replaced
-- tenant A's envelope). Rows kept: a request id was unique before, so it is unique per
-- (namespace, galaxy) too.
ALTER TABLE kouten_envelopes DROP CONSTRAINT kouten_envelopes_pkey;
ALTER TABLE kouten_envelopes ADD PRIMARY KEY (namespace, galaxy, request_id);
CREATE INDEX kouten_envelopes_by_request ON kouten_envelopes (namespace, request_id);
