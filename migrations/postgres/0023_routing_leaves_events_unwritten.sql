-- Routing an event no longer writes its row (ADR 0035, docs/relay.md).
--
-- `routed_at` was the predicate column of the partial index
-- `outbox_unrouted`, so marking an event routed was never an in-place
-- update: each mark wrote a new copy of the event's row, payload included,
-- and an entry in each of the outbox's indexes. Events not yet routed now
-- wait in a queue of their ids, filled on every insert into the outbox by
-- the trigger below, and routing deletes them from it.
DROP INDEX outbox_unrouted;
CREATE TABLE outbox_unrouted (id BIGINT PRIMARY KEY);
INSERT INTO outbox_unrouted (id) SELECT id FROM outbox WHERE routed_at IS NULL;
ALTER TABLE outbox DROP COLUMN routed_at;

CREATE FUNCTION ratchet_outbox_enqueue()
RETURNS TRIGGER
LANGUAGE plpgsql
AS $fn$
BEGIN
    INSERT INTO outbox_unrouted (id) SELECT id FROM inserted;
    RETURN NULL;
END
$fn$;

-- Once per statement: a completion inserts its events in one statement.
CREATE TRIGGER outbox_enqueue AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION ratchet_outbox_enqueue();

-- A delivery is only ever inserted by routing, for an event it has just
-- read, and events are never deleted. The foreign key's check, a lookup of
-- the event and a lock on its row for each delivery inserted, cost a third
-- of routing's insert and guarded nothing routing does not; the audit
-- reports a delivery whose event is missing (`ratchet audit`).
ALTER TABLE deliveries DROP CONSTRAINT deliveries_outbox_id_fkey;
