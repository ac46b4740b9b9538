-- A record given up on with the provider's outcome unknown (its stored
-- answer is 500 request_abandoned) gets its own state, 'abandoned': it is
-- replayed, and never reclaimed nor pruned, since the money may have moved.
-- SQLite cannot alter a CHECK constraint, so the table is rebuilt.

CREATE TABLE idempotent_requests_new (
    id                    INTEGER PRIMARY KEY,
    idempotency_key       TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    route                 TEXT NOT NULL,
    customer_id           TEXT NOT NULL,
    request_hash          TEXT NOT NULL CHECK (length(request_hash) = 64),
    state                 TEXT NOT NULL CHECK (state IN ('in_progress', 'complete', 'abandoned')),
    lease_token           TEXT,
    locked_until          INTEGER,
    -- No foreign key: the claim inserts the record before its charge (the
    -- record insert is the arbiter), and distributed engines lack deferred FKs.
    charge_id             TEXT NOT NULL,
    response_status       INTEGER,
    response_body         TEXT,
    response_content_type TEXT,
    response_location     TEXT,
    created_at            INTEGER NOT NULL,
    completed_at          INTEGER,
    expires_at            INTEGER NOT NULL,
    -- The arbiter of concurrent retries.
    UNIQUE (idempotency_key, route)
);

INSERT INTO idempotent_requests_new
SELECT id, idempotency_key, route, customer_id, request_hash,
       CASE WHEN state = 'complete' AND response_status = 500 THEN 'abandoned' ELSE state END,
       lease_token, locked_until, charge_id, response_status, response_body,
       response_content_type, response_location, created_at, completed_at, expires_at
FROM idempotent_requests;

DROP TABLE idempotent_requests;
ALTER TABLE idempotent_requests_new RENAME TO idempotent_requests;

-- The reaper: in-progress records by lease expiry.
CREATE INDEX idempotent_requests_reaper ON idempotent_requests (state, locked_until);
-- The pruner: completed records by expiry.
CREATE INDEX idempotent_requests_pruner ON idempotent_requests (state, expires_at);
