-- Values every process of one database must agree on, stored by the first
-- to start and compared by every later one. `provider_key_fingerprint`: a
-- fingerprint of PROVIDER_KEY_SECRET, which ids and provider idempotency
-- keys are derived under (issue 24); a replica or jobs runner with another
-- secret refuses to start.
CREATE TABLE settings (
    name VARCHAR(64) NOT NULL PRIMARY KEY,
    value VARCHAR(255) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
