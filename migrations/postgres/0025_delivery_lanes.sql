-- A claim finds the runs it may send through their lanes (ADR 0038,
-- docs/relay.md): one row per run and sink with a pending delivery, due
-- when the run's earliest pending delivery may be sent (`due_at`: its
-- `next_at`, or its lease's end while it is leased; NULL once nothing of
-- the run is pending for the sink).
--
-- A claim used to walk the due deliveries in order and ask of each whether
-- an earlier one of its run was still pending. Most were not their run's
-- first, so with runs that had come to different points a claim of 128
-- runs asked that of thousands of deliveries.
--
-- A lane's row is also the lock that keeps it right: routing (adding a
-- run's deliveries), a relay recording results, and a redelivery each lock
-- the lanes they touch, in the order of their keys, before they change the
-- deliveries under them; a claim takes only lanes no one holds
-- (`SKIP LOCKED`).
CREATE TABLE delivery_lanes (
    run_id TEXT NOT NULL,
    sink   TEXT NOT NULL,
    due_at BIGINT,
    PRIMARY KEY (run_id, sink)
);
CREATE INDEX delivery_lanes_due ON delivery_lanes (sink, due_at) WHERE due_at IS NOT NULL;

INSERT INTO delivery_lanes (run_id, sink, due_at)
SELECT DISTINCT ON (run_id, sink) run_id, sink, GREATEST(next_at, lease_expires_at)
FROM deliveries
WHERE state = 'pending'
ORDER BY run_id, sink, outbox_id;

-- Claims no longer read pending deliveries in the order they fall due: the
-- index of that order goes, and routing writes one entry fewer per
-- delivery.
DROP INDEX deliveries_due;
