-- A model answer is stored as the exact bytes it holds: TEXT refuses a NUL,
-- and a NUL in an answer made every attempt of the stage fail to journal.
ALTER TABLE model_calls ALTER COLUMN response TYPE BYTEA USING convert_to(response, 'UTF8');
-- A backend's refusal is an answer too, journaled so that a retry meets it
-- at the same call index (`response` then holds the refusal's message).
ALTER TABLE model_calls ADD COLUMN rejected BIGINT NOT NULL DEFAULT 0;
