-- Reconciliation looks at every unsettled operation in turn (issue 23).
-- `looked_at`: when a reconcile pass last looked at the charge or refund
-- and could not settle it (the database's clock). Passes read the least
-- recently looked at first (else by `updated_at`, when it became
-- unsettled), so those a pass cannot settle (they need a person) go behind
-- the others instead of filling every batch. Adding a nullable column with
-- no default rewrites nothing.
ALTER TABLE charges ADD COLUMN looked_at TIMESTAMPTZ;
ALTER TABLE refunds ADD COLUMN looked_at TIMESTAMPTZ;

-- Refunds the provider answered `pending` (status `pending` with the
-- provider's id), which reconciliation polls until they are final.
CREATE INDEX refunds_pending_at_provider ON refunds (updated_at)
    WHERE status = 'pending' AND gateway_refund_id IS NOT NULL;
