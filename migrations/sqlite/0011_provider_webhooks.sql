-- Provider webhooks in (issue 29).
--
-- Times are Unix milliseconds, the database's clock.
--
-- `provider_events` is the inbox: each provider event id the server has
-- handled, written in the transaction of its effect, so a duplicate
-- delivery (or two at once) is applied once. `state`: applied; ignored (a
-- type or object that is none of ours); waiting (it names one of our
-- operations that has no row yet: re-applied by the jobs runner until it
-- has); needs_person (applied as far as it could be; `detail` says what is
-- left for a person). `gateway_charge_id`: the provider charge it is about.
CREATE TABLE provider_events (
    id                TEXT PRIMARY KEY,
    type              TEXT NOT NULL,
    gateway_charge_id TEXT,
    state             TEXT NOT NULL
        CHECK (state IN ('applied', 'ignored', 'waiting', 'needs_person')),
    detail            TEXT,
    received_at       INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

CREATE INDEX provider_events_waiting ON provider_events (updated_at) WHERE state = 'waiting';
CREATE INDEX provider_events_received ON provider_events (received_at, id);

-- A charge's disputes, as the provider last showed them. `id` is ours
-- (derived from the provider's, which is UNIQUE here); `refundable` is the
-- provider's `is_charge_refundable` (1 or 0); `evidence_due_by` Unix
-- seconds, the provider's clock.
CREATE TABLE disputes (
    id                 TEXT PRIMARY KEY,
    gateway_dispute_id TEXT NOT NULL UNIQUE,
    charge_id          TEXT NOT NULL REFERENCES charges (id),
    amount_cents       INTEGER NOT NULL,
    currency           TEXT NOT NULL,
    status             TEXT NOT NULL,
    reason             TEXT NOT NULL,
    refundable         INTEGER NOT NULL,
    evidence_due_by    INTEGER,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL
);

CREATE INDEX disputes_charge ON disputes (charge_id);
CREATE INDEX disputes_created ON disputes (created_at, id);

-- A provider refund is one local refund at most: a refund made in the
-- provider's dashboard is created here once, whatever events announce it.
CREATE UNIQUE INDEX refunds_gateway_refund_id ON refunds (gateway_refund_id);
