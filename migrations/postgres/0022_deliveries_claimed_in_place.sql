-- A claim writes only a delivery's lease and attempt count, none of them
-- indexed: with room on the row's page, PostgreSQL updates the row in place
-- (a HOT update) instead of adding an entry to each of the table's five
-- indexes, which made a claim cost twice what it does now (ADR 0033).
-- Pages filled from now on keep half of themselves free for it.
ALTER TABLE deliveries SET (fillfactor = 50);
