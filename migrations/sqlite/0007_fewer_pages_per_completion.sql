-- A batch of completions wrote about 62 WAL pages for 64 stages; these
-- three indexes were a third of them (ADR 0015).
--
-- Whether a run has finished: a count of its jobs that have not succeeded,
-- kept by the completions, instead of an index of every job by run and
-- state that each claim and each completion moved an entry in. The count
-- only says when to look: a run finishes when no job of it is left
-- unsucceeded, checked through the jobs themselves.
ALTER TABLE runs ADD COLUMN unfinished INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET unfinished = (SELECT COUNT(*) FROM jobs
                              WHERE jobs.run_id = runs.id AND jobs.state != 'succeeded');
DROP INDEX jobs_run_state;

-- Claims look jobs up by state only while they can still run: a finished
-- job leaves the index instead of moving within it. SQLite uses a partial
-- index only for a query whose WHERE repeats its condition word for word;
-- the store's queries do (`live!()` in store/sqlite/mod.rs).
DROP INDEX jobs_claimable;
CREATE INDEX jobs_live ON jobs (state, next_run_at, id)
    WHERE state IN ('blocked', 'ready', 'running');

-- A run's attempts are found through its jobs (the primary key starts with
-- the job); no query reads them by run and stage.
DROP INDEX attempts_run;
