-- Routing reads nothing of an event but its row in the queue (ADR 0040,
-- docs/relay.md).
--
-- The queue of events to route held their ids alone, so the router read
-- each page's events from the outbox by key (their run and name: which
-- sinks take an event, and its lane) before the transaction that routed
-- them: a lookup in the outbox's index and a read of its row, payload
-- included, for every event, and the page's rows sent back to the
-- database as arrays. The trigger that fills the queue now copies both
-- columns from the rows each insert added, and routing takes a page out of
-- the queue and routes it in one statement.
ALTER TABLE outbox_unrouted ADD COLUMN run_id TEXT, ADD COLUMN event TEXT;
UPDATE outbox_unrouted q SET run_id = o.run_id, event = o.event
FROM outbox o WHERE o.id = q.id;
-- An id whose event is gone (only a hand on the database removes one) was
-- never read by routing and stayed at the head of the queue.
DELETE FROM outbox_unrouted WHERE run_id IS NULL;
ALTER TABLE outbox_unrouted ALTER COLUMN run_id SET NOT NULL,
                            ALTER COLUMN event SET NOT NULL;

CREATE OR REPLACE FUNCTION ratchet_outbox_enqueue()
RETURNS TRIGGER
LANGUAGE plpgsql
AS $fn$
BEGIN
    INSERT INTO outbox_unrouted (id, run_id, event) SELECT id, run_id, event FROM inserted;
    RETURN NULL;
END
$fn$;
