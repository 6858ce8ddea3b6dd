-- Written by PostgreSQL claims only (ADR 0018): SQLite's seq counter moves
-- inside its one writer's transactions, so seq order is commit order.
ALTER TABLE attempts ADD COLUMN deps_seen INTEGER;
-- The seq value taken when the run failed (ADR 0018).
ALTER TABLE runs ADD COLUMN failed_seq INTEGER;
-- The audit reads one run at a time.
CREATE INDEX outbox_run ON outbox (run_id);
