-- Events and webhooks (issue 28).
--
-- `events` is the outbox: every change of a charge, refund or hold inserts
-- its event in the same transaction. `id` is derived from the object's id
-- and the transition (the same change re-made writes the same id);
-- `created_at` is the database's clock (Unix milliseconds); `data` the object
-- after the change, as the API shows it. `dispatched_at`: when the jobs
-- runner made its deliveries (NULL: not yet), so an event committed late
-- is never skipped the way a cursor over `created` would skip it.
CREATE TABLE events (
    id            TEXT PRIMARY KEY,
    type          TEXT NOT NULL,
    object_id     TEXT NOT NULL,
    api_version   TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    data          TEXT NOT NULL,
    dispatched_at INTEGER
);

CREATE INDEX events_created ON events (created_at, id);
CREATE INDEX events_type ON events (type, created_at, id);
CREATE INDEX events_undispatched ON events (created_at) WHERE dispatched_at IS NULL;

-- One row per event and endpoint: its attempts, lease and outcome.
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    event_id        TEXT NOT NULL REFERENCES events (id),
    endpoint        TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    lease_token     TEXT,
    locked_until    INTEGER,
    last_status     INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);
CREATE INDEX webhook_deliveries_state ON webhook_deliveries (state, updated_at);
