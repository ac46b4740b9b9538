-- Reconciliation looks at every unsettled operation in turn (issue 23).
-- `looked_at`: when a reconcile pass last looked at the charge or refund
-- and could not settle it (the database's clock). Passes read the least
-- recently looked at first (else by `updated_at`, when it became
-- unsettled), so those a pass cannot settle (they need a person) go behind
-- the others instead of filling every batch. Refunds the provider answered
-- `pending` are found by the existing `refunds_status (status, updated_at)`.
ALTER TABLE charges ADD COLUMN looked_at DATETIME(6) NULL;
ALTER TABLE refunds ADD COLUMN looked_at DATETIME(6) NULL;
