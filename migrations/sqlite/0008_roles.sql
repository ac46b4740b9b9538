-- Who may move money (issue 26): customers charge, the back office refunds.
-- Every refund stores who asked for it: the token's subject and its role,
-- `customer` or `back_office`. NULL in a refund made before roles (or by
-- a server from before them during a rollout): only a charge's customer
-- could refund then, and the store reads NULL as that customer. No rows
-- are rewritten.
ALTER TABLE refunds ADD COLUMN requested_by TEXT NULL;
ALTER TABLE refunds ADD COLUMN requested_by_role TEXT NULL;

-- The back office's list of every customer's charges, newest first,
-- keyset-paginated on (created_at, id) as a customer's list is.
CREATE INDEX charges_created ON charges (created_at DESC, id DESC);
