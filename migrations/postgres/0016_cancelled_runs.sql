-- A run an operator stopped is `cancelled`, and so is the attempt it
-- fenced out (`ratchet cancel`, docs/job-states.md).
ALTER TABLE runs DROP CONSTRAINT runs_state_check,
    ADD CONSTRAINT runs_state_check
        CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled'));
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check,
    ADD CONSTRAINT attempts_outcome_check
        CHECK (outcome IN ('running', 'succeeded', 'failed', 'lease_expired', 'cancelled'));

-- As in 0014, and `run.cancelled` for a run an operator cancelled.
CREATE OR REPLACE FUNCTION ratchet_lifecycle_events(e_now BIGINT, e_runs TEXT[])
RETURNS VOID
LANGUAGE plpgsql
AS $fn$
BEGIN
    INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
    SELECT r.id || '/run.' || r.state || '#' || r.generation, r.id, '', 'run.' || r.state,
           '{"state":' || to_json(r.state)::TEXT || ',"pipeline":' || to_json(r.pipeline)::TEXT
               || ',"generation":' || r.generation
               || coalesce(',"failed_stage":' || to_json(d.stage)::TEXT, '')
               || coalesce(',"error":' || to_json(d.last_error)::TEXT, '') || '}',
           e_now
    FROM runs r
    LEFT JOIN LATERAL (SELECT j.stage, j.last_error FROM jobs j
                       WHERE j.run_id = r.id AND j.state = 'dead'
                       ORDER BY j.id LIMIT 1) d ON r.state = 'failed'
    WHERE r.id = ANY(e_runs) AND r.state IN ('succeeded', 'failed', 'cancelled')
    ORDER BY r.id
    ON CONFLICT (dedup_key) DO NOTHING;
END
$fn$;
