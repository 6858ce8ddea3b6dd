-- Answers are written as BLOBs from now on (SQLite keeps either kind in the
-- column; older answers stay TEXT and read the same).
-- A backend's refusal is an answer too, journaled so that a retry meets it
-- at the same call index (`response` then holds the refusal's message).
ALTER TABLE model_calls ADD COLUMN rejected INTEGER NOT NULL DEFAULT 0;
