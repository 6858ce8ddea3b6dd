-- Claims take ready jobs in (next_run_at, id) order. SQLite already keeps
-- the rowid (id) at the end of every index; the index is rebuilt with id
-- named so that both backends declare the same claim order.
DROP INDEX jobs_claimable;
CREATE INDEX jobs_claimable ON jobs (state, next_run_at, id);
