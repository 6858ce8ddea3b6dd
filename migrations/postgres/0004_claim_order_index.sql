-- Claims take ready jobs in (next_run_at, id) order. With only next_run_at
-- in the index, every claim sorted all the jobs due at the same time (a
-- fan-out's thousands) to find the first few; with id, the index is in
-- claim order and a claim reads only the rows it takes.
DROP INDEX jobs_claimable;
CREATE INDEX jobs_claimable ON jobs (state, next_run_at, id);
