-- Charges and idempotency records, for MySQL 8.0+ and MariaDB 10.6+.
-- InnoDB, utf8mb4 with a binary collation (keys are compared byte for
-- byte: "Key" and "key" are different keys), DATETIME(6) in UTC.

CREATE TABLE charges (
    id                VARCHAR(64) NOT NULL,
    customer_id       VARCHAR(255) NOT NULL,
    amount_cents      BIGINT NOT NULL,
    currency          CHAR(3) NOT NULL,
    card_token        VARCHAR(255) NOT NULL,
    description       TEXT NULL,
    metadata          TEXT NOT NULL,
    status            VARCHAR(16) NOT NULL,
    -- The idempotency key sent to the provider: unique, so one charge can
    -- never be driven under two keys nor two charges under one.
    provider_key      VARCHAR(255) NOT NULL,
    gateway_charge_id VARCHAR(255) NULL,
    decline_code      VARCHAR(64) NULL,
    created_at        DATETIME(6) NOT NULL,
    updated_at        DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY charges_provider_key (provider_key),
    KEY charges_customer_created (customer_id, created_at),
    CONSTRAINT charges_amount_positive CHECK (amount_cents > 0),
    CONSTRAINT charges_status_known CHECK (status IN ('pending', 'succeeded', 'failed', 'unknown'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE idempotent_requests (
    id                    BIGINT NOT NULL AUTO_INCREMENT,
    idempotency_key       VARCHAR(255) NOT NULL,
    route                 VARCHAR(64) NOT NULL,
    customer_id           VARCHAR(255) NOT NULL,
    request_hash          CHAR(64) NOT NULL,
    state                 VARCHAR(16) NOT NULL,
    lease_token           VARCHAR(64) NULL,
    locked_until          DATETIME(6) NULL,
    -- No foreign key: the claim inserts the record before its charge (the
    -- record insert is the arbiter), and distributed engines lack deferred FKs.
    charge_id             VARCHAR(64) NOT NULL,
    response_status       INT NULL,
    response_body         MEDIUMTEXT NULL,
    response_content_type VARCHAR(255) NULL,
    response_location     VARCHAR(255) NULL,
    created_at            DATETIME(6) NOT NULL,
    completed_at          DATETIME(6) NULL,
    expires_at            DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    -- The arbiter of concurrent retries.
    UNIQUE KEY idempotent_requests_key_route (idempotency_key, route),
    -- The reaper: in-progress records by lease expiry.
    KEY idempotent_requests_reaper (state, locked_until),
    -- The pruner: completed records by expiry (expires_at = created_at + TTL).
    KEY idempotent_requests_pruner (state, expires_at),
    CONSTRAINT idempotent_requests_state_known CHECK (state IN ('in_progress', 'complete'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
