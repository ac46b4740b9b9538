-- Provider charges and refunds that carry one of our operation ids in their
-- metadata but have no row here: money moved with no record of it (a
-- database that lost its last writes, and a client that never retried).
-- Found by `payments-jobs reconcile` (issue 24); settled when the operation's
-- row exists again (its client's retry adopted it). `provider_created`:
-- Unix seconds, the provider's clock; the other times are the database's.
CREATE TABLE orphans (
    provider_id      TEXT NOT NULL PRIMARY KEY,
    kind             TEXT NOT NULL,
    operation_id     TEXT NOT NULL,
    amount_cents     BIGINT NOT NULL,
    currency         TEXT NOT NULL,
    status           TEXT NOT NULL,
    provider_created BIGINT NOT NULL,
    found_at         INTEGER NOT NULL,
    settled_at       INTEGER NULL
);
CREATE INDEX orphans_open ON orphans (settled_at, found_at);
