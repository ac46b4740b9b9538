-- Provider webhooks in (issue 29).
--
-- `provider_events` is the inbox: each provider event id the server has
-- handled, written in the transaction of its effect, so a duplicate
-- delivery (or two at once) is applied once. `state`: applied; ignored (a
-- type or object that is none of ours); waiting (it names one of our
-- operations that has no row yet: re-applied by the jobs runner until it
-- has); needs_person (applied as far as it could be; `detail` says what is
-- left for a person). `gateway_charge_id`: the provider charge it is about.
CREATE TABLE provider_events (
    id                VARCHAR(255) NOT NULL,
    type              VARCHAR(100) NOT NULL,
    gateway_charge_id VARCHAR(255) NULL,
    state             VARCHAR(16) NOT NULL,
    detail            TEXT NULL,
    received_at       DATETIME(6) NOT NULL,
    updated_at        DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    KEY provider_events_waiting (state, updated_at),
    KEY provider_events_received (received_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A charge's disputes, as the provider last showed them. `id` is ours
-- (derived from the provider's, which is UNIQUE here); `refundable` is the
-- provider's `is_charge_refundable` (1 or 0); `evidence_due_by` Unix
-- seconds, the provider's clock.
CREATE TABLE disputes (
    id                 VARCHAR(64) NOT NULL,
    gateway_dispute_id VARCHAR(255) NOT NULL,
    charge_id          VARCHAR(64) NOT NULL,
    amount_cents       BIGINT NOT NULL,
    currency           CHAR(3) NOT NULL,
    status             VARCHAR(32) NOT NULL,
    reason             VARCHAR(64) NOT NULL,
    refundable         BIGINT NOT NULL,
    evidence_due_by    BIGINT NULL,
    created_at         DATETIME(6) NOT NULL,
    updated_at         DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY disputes_gateway_dispute_id (gateway_dispute_id),
    KEY disputes_charge (charge_id),
    KEY disputes_created (created_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A provider refund is one local refund at most: a refund made in the
-- provider's dashboard is created here once, whatever events announce it.
CREATE UNIQUE INDEX refunds_gateway_refund_id ON refunds (gateway_refund_id);
