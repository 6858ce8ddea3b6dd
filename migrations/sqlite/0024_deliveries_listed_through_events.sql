-- A run's deliveries are listed through its events (`outbox_run_stage`),
-- which the foreign key keeps in the outbox: the index by run cost an entry
-- per routed delivery at a place chosen by the run's id, a leaf page per
-- run dirtied and written whole to the WAL by each routing transaction,
-- and no query used it (BENCHMARKS.md, "An index fewer").
DROP INDEX deliveries_by_run;
