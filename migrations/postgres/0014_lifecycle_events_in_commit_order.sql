-- Lifecycle events and commit order per run (docs/relay.md).
--
-- A run's `generation` counts its lives: a run retried after it failed
-- starts the next one, so its second `run.failed` or `run.succeeded` is a
-- new event with a key of its own. Keys already written never change.
ALTER TABLE runs ADD COLUMN generation BIGINT NOT NULL DEFAULT 1;

-- The lifecycle event of each run of `e_runs` that has finished:
-- `run.succeeded` or `run.failed`, keyed `{run}/run.{state}#{generation}`,
-- its payload the run's state, pipeline and generation and, when it failed,
-- the stage that died and why (compact JSON in that order, the text SQLite
-- writes for it, so that both backends hold the same rows). Called in the transaction that finished the
-- run, with its row locked; writing it twice writes it once.
CREATE FUNCTION ratchet_lifecycle_events(e_now BIGINT, e_runs TEXT[])
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
    WHERE r.id = ANY(e_runs) AND r.state IN ('succeeded', 'failed')
    ORDER BY r.id
    ON CONFLICT (dedup_key) DO NOTHING;
END
$fn$;

-- As in 0006, and the finished runs' `run.succeeded` in the same
-- transaction; returns how many runs it finished.
DROP FUNCTION ratchet_finish_runs(BIGINT, TEXT[]);
CREATE FUNCTION ratchet_finish_runs(f_now BIGINT, f_runs TEXT[])
RETURNS BIGINT
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
AS $fn$
DECLARE
    finished TEXT[];
BEGIN
    PERFORM 1 FROM runs r WHERE r.id = ANY(f_runs) ORDER BY r.id FOR NO KEY UPDATE;
    WITH done AS (
        UPDATE runs r SET state = 'succeeded', finished_at = f_now
        WHERE r.id = ANY(f_runs) AND r.state = 'running'
          AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = r.id
                            AND j.state IN ('blocked', 'ready', 'running', 'failed', 'dead',
                                            'cancelled'))
        RETURNING r.id
    )
    SELECT array_agg(done.id) INTO finished FROM done;
    IF finished IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM ratchet_lifecycle_events(f_now, finished);
    RETURN cardinality(finished);
END
$fn$;

-- As in 0006, except that the outbox rows are inserted last, after the
-- rows of their runs are locked (in id order, with the runs the batch may
-- finish, which `ratchet_finish_runs` locks next): a run's events then take
-- their ids in the order its transactions commit, which a sequence alone
-- does not promise, and the relay delivers a run's events in id order.
-- Rows are locked jobs first, then runs, as failing a run does.
CREATE OR REPLACE FUNCTION ratchet_success_and_release(
    o_dedup TEXT[], o_run TEXT[], o_stage TEXT[], o_event TEXT[], o_payload TEXT[],
    o_now BIGINT[], s_now BIGINT, s_jobs BIGINT[],
    t_job BIGINT[], t_attempt BIGINT[], t_now BIGINT[], t_inputs TEXT[],
    t_proposals TEXT[], t_canonical TEXT[], t_won BIGINT[],
    f_run TEXT[], f_stage TEXT[])
RETURNS TABLE (run_id TEXT, from_stage TEXT, to_stage TEXT, state TEXT)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH succeeded AS (
        UPDATE jobs SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,
               last_error = NULL, succeeded_seq = s.seq, updated_at = s_now
        FROM (SELECT x.id, nextval('ratchet_seq') AS seq
              FROM UNNEST(s_jobs) WITH ORDINALITY AS x(id, n) ORDER BY x.n) AS s
        WHERE jobs.id = s.id
    ), attempted AS (
        UPDATE attempts a SET outcome = 'succeeded', finished_at = x.now,
               input_digests = x.inputs, proposal_digests = x.proposals,
               canonical_digests = x.canonical, proposal_won = x.won
        FROM UNNEST(t_job, t_attempt, t_now, t_inputs, t_proposals, t_canonical, t_won)
             AS x(job_id, attempt, now, inputs, proposals, canonical, won)
        WHERE a.job_id = x.job_id AND a.attempt = x.attempt
    ), satisfied AS (
        UPDATE edges e SET satisfied = 1
        FROM UNNEST(f_run, f_stage) AS f(run_id, stage)
        WHERE e.run_id = f.run_id AND e.from_stage = f.stage AND e.satisfied = 0
        RETURNING e.run_id, e.from_stage, e.to_stage
    ), locked AS MATERIALIZED (
        SELECT j.id, d.edges FROM jobs j
        JOIN (SELECT sa.run_id, sa.to_stage, COUNT(*) AS edges FROM satisfied sa
              GROUP BY sa.run_id, sa.to_stage) AS d
          ON j.run_id = d.run_id AND j.stage = d.to_stage
        ORDER BY j.run_id, j.stage
        FOR NO KEY UPDATE OF j
    ), released AS (
        UPDATE jobs j SET pending = j.pending - l.edges,
               state = CASE WHEN j.state = 'blocked' AND j.pending - l.edges <= 0
                            THEN 'ready' ELSE j.state END,
               next_run_at = CASE WHEN j.state = 'blocked' AND j.pending - l.edges <= 0
                                  THEN s_now ELSE j.next_run_at END,
               updated_at = s_now
        FROM locked l WHERE j.id = l.id
        RETURNING j.run_id, j.stage, j.state
    )
    SELECT sa.run_id, sa.from_stage, sa.to_stage, NULL::TEXT FROM satisfied sa
    UNION ALL
    SELECT r.run_id, NULL, r.stage, r.state FROM released r;
    IF cardinality(o_dedup) > 0 THEN
        PERFORM 1 FROM runs r WHERE r.id = ANY(o_run || f_run) ORDER BY r.id
        FOR NO KEY UPDATE;
        INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
        SELECT * FROM UNNEST(o_dedup, o_run, o_stage, o_event, o_payload, o_now)
        ON CONFLICT (dedup_key) DO NOTHING;
    END IF;
END
$fn$;

-- Runs that finished before this migration get their lifecycle event too,
-- recorded as routed already: nothing is sent for them.
SELECT ratchet_lifecycle_events(0, ARRAY(SELECT id FROM runs WHERE state <> 'running'));
UPDATE outbox SET routed_at = created_at WHERE stage = '' AND routed_at IS NULL;
