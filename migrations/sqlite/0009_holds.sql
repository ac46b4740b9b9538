-- Holds (issue 27): a charge made with "capture": false is authorized now
-- and captured (in full or in part) or canceled later, or lapses.
--
-- `status` keeps its four values (its CHECK cannot change without
-- rebuilding the table): a hold is `succeeded` once authorized, as the
-- provider shows it. `hold` says where the hold is: NULL for a charge
-- captured when made; `requires_capture` (set when the charge is made; in
-- force once it succeeded), `captured`, `canceled` or `expired`. The API
-- shows `requires_capture`, `canceled` and `expired` as the status.
-- `amount_captured`: what the capture took (NULL: all of a charge
-- captured when made). Refunds fit in it.
-- `capture_before`: when the hold lapses, Unix milliseconds.
-- `hold_action`: the capture or cancel that has taken the hold while its
-- outcome is pending or unknown.
ALTER TABLE charges ADD COLUMN hold TEXT
    CHECK (hold IN ('requires_capture', 'captured', 'canceled', 'expired'));
ALTER TABLE charges ADD COLUMN amount_captured INTEGER;
ALTER TABLE charges ADD COLUMN capture_before INTEGER;
ALTER TABLE charges ADD COLUMN hold_action TEXT;

CREATE INDEX charges_holds_lapsing ON charges (capture_before) WHERE hold = 'requires_capture';

CREATE TABLE captures (
    id                 TEXT PRIMARY KEY,
    action             TEXT NOT NULL CHECK (action IN ('capture', 'cancel')),
    charge_id          TEXT NOT NULL REFERENCES charges (id),
    customer_id        TEXT NOT NULL,
    requested_by       TEXT NOT NULL,
    requested_by_role  TEXT NOT NULL,
    amount_cents       INTEGER NOT NULL CHECK (amount_cents > 0),
    currency           TEXT NOT NULL CHECK (length(currency) = 3),
    status             TEXT NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed', 'unknown')),
    provider_key       TEXT NOT NULL UNIQUE,
    gateway_id         TEXT,
    failure_code       TEXT,
    provider_called_at INTEGER,
    looked_at          INTEGER,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL
);

CREATE INDEX captures_charge ON captures (charge_id, created_at);
CREATE INDEX captures_unknown ON captures (updated_at) WHERE status = 'unknown';
