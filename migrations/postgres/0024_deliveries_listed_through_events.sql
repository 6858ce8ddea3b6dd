-- A run's deliveries are listed through its events (`outbox_run_stage`),
-- and the audit finds a delivery whose event is missing by reading every
-- delivery once: the index by run is gone. It was the only index of the
-- table without `state` in its predicate other than the two keys, so
-- recording a delivery's result (never an in-place update, as `state`
-- changes) added an entry to it, as routing did (BENCHMARKS.md, "An index
-- fewer").
DROP INDEX deliveries_by_run;
