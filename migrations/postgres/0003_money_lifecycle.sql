-- The rest of the money lifecycle: refunds, finding charges, reconciliation.

-- What has been refunded (succeeded refunds, shown as `amount_refunded`)
-- and reserved (pending, succeeded and unknown refunds; internal): a refund
-- reserves its amount in its claim's transaction by a conditional update,
-- so the reserved sum can never pass the charge's amount.
ALTER TABLE charges
    ADD COLUMN amount_refunded  BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN amount_reserved  BIGINT NOT NULL DEFAULT 0,
    -- The key of the operation that made the charge, kept past the key's
    -- 24 h, for `GET /api/charges?idempotency_key=`.
    ADD COLUMN idempotency_key  TEXT,
    -- When the last provider call for this charge was sent (the
    -- database's clock); NULL for calls made before their metadata named
    -- the charge, which reconciliation never concludes were not made.
    ADD COLUMN provider_called_at TIMESTAMPTZ,
    ADD CONSTRAINT charges_refunds_fit
        CHECK (amount_refunded >= 0 AND amount_refunded <= amount_reserved
               AND amount_reserved <= amount_cents);

-- Listing: a customer's charges newest first, keyset-paginated on
-- (created_at, id); one index range scan per page.
DROP INDEX charges_customer_created;
CREATE INDEX charges_customer_created ON charges (customer_id, created_at DESC, id DESC);
CREATE INDEX charges_customer_key ON charges (customer_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Reconciliation: the few charges whose outcome is unknown.
CREATE INDEX charges_unknown ON charges (updated_at) WHERE status = 'unknown';

CREATE TABLE refunds (
    id                 TEXT PRIMARY KEY,
    charge_id          TEXT NOT NULL REFERENCES charges (id),
    customer_id        TEXT NOT NULL,
    amount_cents       BIGINT NOT NULL CHECK (amount_cents > 0),
    currency           TEXT NOT NULL CHECK (length(currency) = 3),
    reason             TEXT CHECK (reason IN ('requested_by_customer', 'duplicate', 'fraudulent')),
    metadata           JSONB NOT NULL DEFAULT '{}',
    status             TEXT NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed', 'unknown')),
    -- The idempotency key sent to the provider, derived from the refund's id.
    provider_key       TEXT NOT NULL UNIQUE,
    gateway_refund_id  TEXT,
    failure_code       TEXT,
    provider_called_at TIMESTAMPTZ,
    created_at         TIMESTAMPTZ NOT NULL,
    updated_at         TIMESTAMPTZ NOT NULL
);

CREATE INDEX refunds_charge_created ON refunds (charge_id, created_at DESC, id DESC);
CREATE INDEX refunds_unknown ON refunds (updated_at) WHERE status = 'unknown';

-- A refund's record names its refund (its `charge_id` is the refunded
-- charge). NULL on charge records, and on a refund refused as not fitting.
ALTER TABLE idempotent_requests ADD COLUMN refund_id TEXT;
