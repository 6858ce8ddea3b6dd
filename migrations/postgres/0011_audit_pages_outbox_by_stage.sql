-- The audit reads a run's outbox rows a page of stages at a time
-- (`run_id = ? AND stage > ? AND stage <= ?`): an index on the run alone
-- made every page scan all of the run's rows.
DROP INDEX outbox_run;
CREATE INDEX outbox_run_stage ON outbox (run_id, stage);
