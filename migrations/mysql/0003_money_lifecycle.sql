-- The rest of the money lifecycle: refunds, finding charges, reconciliation.

-- What has been refunded (succeeded refunds, shown as `amount_refunded`)
-- and reserved (pending, succeeded and unknown refunds; internal): a refund
-- reserves its amount in its claim's transaction by a conditional update,
-- so the reserved sum can never pass the charge's amount.
-- `idempotency_key`: the key of the operation that made the charge, kept
-- past the key's 24 h. `provider_called_at`: when the last provider call
-- was sent (the database's clock); NULL for calls made before their
-- metadata named the charge, which reconciliation never concludes were not
-- made.
ALTER TABLE charges
    ADD COLUMN amount_refunded    BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN amount_reserved    BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN idempotency_key    VARCHAR(255) NULL,
    ADD COLUMN provider_called_at DATETIME(6) NULL,
    ADD CONSTRAINT charges_refunds_fit
        CHECK (amount_refunded >= 0 AND amount_refunded <= amount_reserved
               AND amount_reserved <= amount_cents),
    -- Listing: a customer's charges newest first, keyset-paginated on
    -- (created_at, id).
    DROP KEY charges_customer_created,
    ADD KEY charges_customer_created (customer_id, created_at, id),
    ADD KEY charges_customer_key (customer_id, idempotency_key),
    -- Reconciliation: the charges whose outcome is unknown.
    ADD KEY charges_status (status, updated_at);

CREATE TABLE refunds (
    id                 VARCHAR(64) NOT NULL,
    charge_id          VARCHAR(64) NOT NULL,
    customer_id        VARCHAR(255) NOT NULL,
    amount_cents       BIGINT NOT NULL,
    currency           CHAR(3) NOT NULL,
    reason             VARCHAR(32) NULL,
    metadata           TEXT NOT NULL,
    status             VARCHAR(16) NOT NULL,
    -- The idempotency key sent to the provider, derived from the refund's id.
    provider_key       VARCHAR(255) NOT NULL,
    gateway_refund_id  VARCHAR(255) NULL,
    failure_code       VARCHAR(64) NULL,
    provider_called_at DATETIME(6) NULL,
    created_at         DATETIME(6) NOT NULL,
    updated_at         DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY refunds_provider_key (provider_key),
    KEY refunds_charge_created (charge_id, created_at, id),
    KEY refunds_status (status, updated_at),
    CONSTRAINT refunds_charge FOREIGN KEY (charge_id) REFERENCES charges (id),
    CONSTRAINT refunds_amount_positive CHECK (amount_cents > 0),
    CONSTRAINT refunds_reason_known
        CHECK (reason IN ('requested_by_customer', 'duplicate', 'fraudulent')),
    CONSTRAINT refunds_status_known CHECK (status IN ('pending', 'succeeded', 'failed', 'unknown'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A refund's record names its refund (its `charge_id` is the refunded
-- charge). NULL on charge records, and on a refund refused as not fitting.
ALTER TABLE idempotent_requests ADD COLUMN refund_id VARCHAR(64) NULL;
