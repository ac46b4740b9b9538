-- Holds (issue 27): a charge made with "capture": false is authorized now
-- and captured (in full or in part) or canceled later, or lapses.
--
-- `status` keeps its four values: a hold is `succeeded` once authorized,
-- as the provider shows it. `hold` says where the hold is: NULL for a
-- charge captured when made; `requires_capture` (set when the charge is
-- made; in force once it succeeded), `captured`, `canceled` or `expired`.
-- The API shows `requires_capture`, `canceled` and `expired` as the
-- charge's status.
-- `amount_captured`: what the capture took (NULL: all of a charge
-- captured when made). Refunds fit in it.
-- `capture_before`: when the hold lapses (the provider's, else its
-- authorization's time plus HOLD_EXPIRY).
-- `hold_action`: the capture or cancel that has taken the hold while its
-- outcome is pending or unknown; set and cleared by conditional updates.
--
-- One ALTER, one table rebuild (on Galera, TOI: docs/operations.md).
ALTER TABLE charges
    ADD COLUMN hold            VARCHAR(16) NULL,
    ADD COLUMN amount_captured BIGINT NULL,
    ADD COLUMN capture_before  DATETIME(6) NULL,
    ADD COLUMN hold_action     VARCHAR(64) NULL,
    ADD CONSTRAINT charges_hold_known
        CHECK (hold IN ('requires_capture', 'captured', 'canceled', 'expired')),
    ADD CONSTRAINT charges_capture_fits
        CHECK (amount_captured IS NULL OR (amount_captured >= 0 AND amount_captured <= amount_cents)),
    -- The jobs runner's pass over holds that lapse.
    ADD KEY charges_holds_lapsing (hold, capture_before);

CREATE TABLE captures (
    id                 VARCHAR(64) NOT NULL,
    action             VARCHAR(16) NOT NULL,
    charge_id          VARCHAR(64) NOT NULL,
    customer_id        VARBINARY(255) NOT NULL,
    requested_by       VARCHAR(255) NOT NULL,
    requested_by_role  VARCHAR(16) NOT NULL,
    amount_cents       BIGINT NOT NULL,
    currency           CHAR(3) NOT NULL,
    status             VARCHAR(16) NOT NULL,
    provider_key       VARCHAR(255) NOT NULL,
    gateway_id         VARCHAR(255) NULL,
    failure_code       VARCHAR(64) NULL,
    provider_called_at DATETIME(6) NULL,
    looked_at          DATETIME(6) NULL,
    created_at         DATETIME(6) NOT NULL,
    updated_at         DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY captures_provider_key (provider_key),
    KEY captures_charge (charge_id, created_at),
    KEY captures_status (status, updated_at),
    CONSTRAINT captures_charge FOREIGN KEY (charge_id) REFERENCES charges (id),
    CONSTRAINT captures_action_known CHECK (action IN ('capture', 'cancel')),
    CONSTRAINT captures_amount_positive CHECK (amount_cents > 0),
    CONSTRAINT captures_status_known CHECK (status IN ('pending', 'succeeded', 'failed', 'unknown'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
