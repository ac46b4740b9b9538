-- Charges and idempotency records.

CREATE TABLE charges (
    id                TEXT PRIMARY KEY,
    customer_id       TEXT NOT NULL,
    amount_cents      BIGINT NOT NULL CHECK (amount_cents > 0),
    currency          TEXT NOT NULL CHECK (length(currency) = 3),
    card_token        TEXT NOT NULL,
    description       TEXT,
    metadata          JSONB NOT NULL DEFAULT '{}',
    status            TEXT NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed', 'unknown')),
    -- The idempotency key sent to the provider: unique, so one charge can
    -- never be driven under two keys nor two charges under one.
    provider_key      TEXT NOT NULL UNIQUE,
    gateway_charge_id TEXT,
    decline_code      TEXT,
    created_at        TIMESTAMPTZ NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL
);

CREATE INDEX charges_customer_created ON charges (customer_id, created_at);

CREATE TABLE idempotent_requests (
    id                    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key       TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    route                 TEXT NOT NULL,
    customer_id           TEXT NOT NULL,
    request_hash          TEXT NOT NULL CHECK (length(request_hash) = 64),
    state                 TEXT NOT NULL CHECK (state IN ('in_progress', 'complete')),
    lease_token           TEXT,
    locked_until          TIMESTAMPTZ,
    -- No foreign key: the claim inserts the record before its charge (the
    -- record insert is the arbiter), and distributed engines lack deferred FKs.
    charge_id             TEXT NOT NULL,
    response_status       INTEGER,
    response_body         TEXT,
    response_content_type TEXT,
    response_location     TEXT,
    created_at            TIMESTAMPTZ NOT NULL,
    completed_at          TIMESTAMPTZ,
    expires_at            TIMESTAMPTZ NOT NULL,
    -- The arbiter of concurrent retries.
    CONSTRAINT idempotent_requests_key_route UNIQUE (idempotency_key, route)
);

-- The reaper: in-progress records by lease expiry.
CREATE INDEX idempotent_requests_reaper ON idempotent_requests (state, locked_until);
-- The pruner: completed records by expiry (expires_at = created_at + TTL).
CREATE INDEX idempotent_requests_pruner ON idempotent_requests (state, expires_at);
