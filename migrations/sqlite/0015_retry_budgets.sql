-- `ratchet retry` gives a dead or cancelled stage a new budget of attempts
-- by raising its limit: the attempt number is the fencing token and never
-- goes back (docs/job-states.md). `attempt_budget` is how many attempts one
-- budget holds, recorded at the first retry (until then `max_attempts` is
-- that number).
ALTER TABLE jobs ADD COLUMN attempt_budget INTEGER;
