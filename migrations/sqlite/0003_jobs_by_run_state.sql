-- Deciding whether a run has finished looks for an unfinished job of the
-- run by state; without this index that was a scan of the run's jobs on
-- every completion (BENCHMARKS.md, fan-out).
CREATE INDEX jobs_run_state ON jobs (run_id, state);
