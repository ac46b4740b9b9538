-- Provider charges and refunds that carry one of our operation ids in their
-- metadata but have no row here: money moved with no record of it (a
-- database that lost its last writes, and a client that never retried).
-- Found by `payments-jobs reconcile` (issue 24); settled when the operation's
-- row exists again (its client's retry adopted it). `provider_created`:
-- Unix seconds, the provider's clock; the other times are the database's.
CREATE TABLE orphans (
    provider_id      VARCHAR(255) NOT NULL PRIMARY KEY,
    kind             VARCHAR(16) NOT NULL,
    operation_id     VARCHAR(64) NOT NULL,
    amount_cents     BIGINT NOT NULL,
    currency         CHAR(3) NOT NULL,
    status           VARCHAR(32) NOT NULL,
    provider_created BIGINT NOT NULL,
    found_at         DATETIME(6) NOT NULL,
    settled_at       DATETIME(6) NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE INDEX orphans_open ON orphans (settled_at, found_at);
