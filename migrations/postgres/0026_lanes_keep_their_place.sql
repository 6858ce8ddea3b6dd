-- Recording a result no longer adds index entries (ADR 0039,
-- docs/relay.md). The index of pending deliveries by run and sink was
-- partial on `state`, so the result that took a delivery out of it changed
-- an indexed column: PostgreSQL wrote a new entry in each of the table's
-- indexes instead of updating the row in place (a HOT update).
--
-- A run's deliveries to a sink are now indexed whatever their state, by
-- the unique key that replaces `(outbox_id, sink)` (an event belongs to one
-- run), and a lane keeps its place: `first_pending`, the event of its
-- earliest delivery that may still be pending (NULL when none is), which
-- claims and results read the lane from instead of passing every delivery
-- it has already finished.
ALTER TABLE delivery_lanes ADD COLUMN first_pending BIGINT;
UPDATE delivery_lanes l SET first_pending = (
    SELECT min(d.outbox_id) FROM deliveries d
    WHERE d.state = 'pending' AND d.run_id = l.run_id AND d.sink = l.sink);

CREATE UNIQUE INDEX deliveries_in_lane ON deliveries (run_id, sink, outbox_id);
ALTER TABLE deliveries DROP CONSTRAINT deliveries_outbox_id_sink_key;
DROP INDEX deliveries_in_order;
