-- What a claim saw of its stage's dependencies: how many of its incoming
-- edges were satisfied in the claim's snapshot. A satisfied edge is written
-- by its predecessor's completion, so a count equal to the incoming edges
-- proves each predecessor committed before the claim; a sequence value does
-- not (ADR 0018). NULL for claims made before this migration.
ALTER TABLE attempts ADD COLUMN deps_seen BIGINT;
-- The sequence value taken when the run failed, after its jobs were
-- cancelled in the same transaction: no claim of the run's jobs that
-- committed before the failure took a later one (ADR 0018).
ALTER TABLE runs ADD COLUMN failed_seq BIGINT;
-- The audit reads one run at a time.
CREATE INDEX outbox_run ON outbox (run_id);
