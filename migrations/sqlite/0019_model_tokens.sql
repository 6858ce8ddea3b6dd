-- The tokens a backend counted for each journaled answer, when it says
-- (NULL for older answers and for backends that do not count).
ALTER TABLE model_calls ADD COLUMN prompt_tokens INTEGER;
ALTER TABLE model_calls ADD COLUMN completion_tokens INTEGER;
