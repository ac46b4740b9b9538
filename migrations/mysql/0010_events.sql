-- Events and webhooks (issue 28).
--
-- `events` is the outbox: every change of a charge, refund or hold inserts
-- its event in the same transaction. `id` is derived from the object's id
-- and the transition (the same change re-made writes the same id);
-- `created_at` is the database's clock; `data` the object after the change,
-- as the API shows it. `dispatched_at`: when the jobs runner made its
-- deliveries (NULL: not yet), so an event committed late is never skipped
-- the way a cursor over `created` would skip it.
CREATE TABLE events (
    id            VARCHAR(36) NOT NULL,
    type          VARCHAR(40) NOT NULL,
    object_id     VARCHAR(255) NOT NULL,
    api_version   VARCHAR(16) NOT NULL,
    created_at    DATETIME(6) NOT NULL,
    data          MEDIUMTEXT NOT NULL,
    dispatched_at DATETIME(6) NULL,
    PRIMARY KEY (id),
    KEY events_created (created_at, id),
    KEY events_type (type, created_at, id),
    KEY events_undispatched (dispatched_at, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per event and endpoint (URLs are at most 500 characters).
CREATE TABLE webhook_deliveries (
    id              VARCHAR(36) NOT NULL,
    event_id        VARCHAR(36) NOT NULL,
    endpoint        VARCHAR(500) NOT NULL,
    state           VARCHAR(16) NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6) NOT NULL,
    lease_token     VARCHAR(64) NULL,
    locked_until    DATETIME(6) NULL,
    last_status     BIGINT NULL,
    last_error      VARCHAR(500) NULL,
    created_at      DATETIME(6) NOT NULL,
    updated_at      DATETIME(6) NOT NULL,
    PRIMARY KEY (id),
    KEY webhook_deliveries_due (state, next_attempt_at),
    KEY webhook_deliveries_event (event_id),
    KEY webhook_deliveries_state (state, updated_at),
    CONSTRAINT webhook_deliveries_event FOREIGN KEY (event_id) REFERENCES events (id),
    CONSTRAINT webhook_deliveries_state_known CHECK (state IN ('pending', 'delivered', 'failed'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
