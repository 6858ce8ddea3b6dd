-- The dead letters are kept apart, and pending deliveries are counted
-- through their lanes: counting either, and redelivering every dead
-- letter, no longer reads every delivery ever made (docs/relay.md).
--
-- No index of `deliveries` can find them: since migration 0026 none has
-- `state` in its predicate, so that recording a result updates the row
-- in place (ADR 0039). Every scrape of the metrics counted pending and
-- dead deliveries by reading the whole table, twice, as did `ratchet
-- outbox redeliver --dead`, and a relay run `--until-idle` each time it
-- looked whether it was done.
--
-- A row here for each delivery whose state is `dead`: added by the
-- transaction that records the dead letter, removed by the one that
-- redelivers it.
CREATE TABLE dead_deliveries (
    id   BIGINT PRIMARY KEY,
    sink TEXT NOT NULL
);
INSERT INTO dead_deliveries (id, sink) SELECT id, sink FROM deliveries WHERE state = 'dead';
