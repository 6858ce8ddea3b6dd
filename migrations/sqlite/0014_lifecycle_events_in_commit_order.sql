-- Lifecycle events (docs/relay.md). A run's `generation` counts its lives:
-- a run retried after it failed starts the next one, so its second
-- `run.failed` or `run.succeeded` is a new event with a key of its own.
-- (On SQLite one writer commits at a time, so a run's events take their ids
-- in commit order without a lock of their own.)
ALTER TABLE runs ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;

-- Runs that finished before this migration get their lifecycle event too
-- (as `lifecycle_events` in store/sqlite/runs.rs writes it), recorded as
-- routed already: nothing is sent for them.
INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at, routed_at)
SELECT r.id || '/run.' || r.state || '#' || r.generation, r.id, '', 'run.' || r.state,
       json_patch('{}', json_object(
           'state', r.state, 'pipeline', r.pipeline, 'generation', r.generation,
           'failed_stage', (SELECT j.stage FROM jobs j WHERE j.run_id = r.id
                              AND j.state = 'dead' ORDER BY j.id LIMIT 1),
           'error', (SELECT j.last_error FROM jobs j WHERE j.run_id = r.id
                       AND j.state = 'dead' ORDER BY j.id LIMIT 1))),
       0, 0
FROM runs r
WHERE r.state IN ('succeeded', 'failed')
ORDER BY r.id;
