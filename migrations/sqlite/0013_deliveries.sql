-- The relay (runtime/src/relay): each committed event is routed once to
-- the sinks its relay's sinks file has for it, one delivery per (event,
-- sink) with its own state, attempts and lease. `routed_at` replaces
-- `published_at`, which nothing ever set: an event is published per sink.
DROP INDEX outbox_unpublished;
ALTER TABLE outbox DROP COLUMN published_at;
ALTER TABLE outbox ADD COLUMN routed_at INTEGER;
CREATE INDEX outbox_unrouted ON outbox (id) WHERE routed_at IS NULL;

CREATE TABLE deliveries (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    outbox_id        INTEGER NOT NULL REFERENCES outbox (id),
    sink             TEXT NOT NULL,
    run_id           TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_at          INTEGER NOT NULL,
    -- When the current series of attempts began: created, or redelivered.
    retrying_since   INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    last_status      INTEGER,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    delivered_at     INTEGER,
    UNIQUE (outbox_id, sink)
);
-- Due deliveries, and the earlier pending ones of the same run and sink
-- that hold a later one back.
CREATE INDEX deliveries_due ON deliveries (next_at, outbox_id) WHERE state = 'pending';
CREATE INDEX deliveries_in_order ON deliveries (run_id, sink, outbox_id) WHERE state = 'pending';
CREATE INDEX deliveries_by_run ON deliveries (run_id, outbox_id);
