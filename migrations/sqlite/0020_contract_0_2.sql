-- Contract 0.2.0 (ratchet:stage@0.2.0).

-- Contract 0.2.0's answers: why each ended (`stop`, `length`,
-- `content_filter`, `other`) and the model that gave it, as the backend
-- named it. NULL for refusals and for answers journaled before.
ALTER TABLE model_calls ADD COLUMN finish_reason TEXT;
ALTER TABLE model_calls ADD COLUMN model TEXT;

-- The version of Ratchet's contract each component speaks, read from its
-- imports at registration. Every component registered before 0.2.0 was
-- served speaks 0.1.0.
ALTER TABLE plugins ADD COLUMN contract TEXT NOT NULL DEFAULT '0.1.0';
