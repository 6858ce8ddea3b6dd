-- Approval gates (`approve = "..."` in a pipeline, ADR 0027): a gate's job
-- runs no plugin (`plugin_digest` is NULL, `gate` holds what to check) and
-- waits in the new state `awaiting` for an operator's decision, which is
-- recorded as an attempt that ran no plugin either.
--
-- Maps (`map = "split.parts"`, ADR 0028): a mapped stage's job names its
-- list (`map_stage`, `map_output`) and the most elements it may hold
-- (`map_cap`); released, it is `mapping` for as long as the transaction
-- that releases it expands it into element jobs (`map_count` of them) or
-- joins their outputs. The job of the list's stage knows, in `lists`, which
-- of its outputs are mapped over and how long each may be, so that its
-- attempt fails before committing a list that cannot be mapped.
ALTER TABLE jobs ALTER COLUMN plugin_digest DROP NOT NULL,
    ADD COLUMN gate TEXT,
    ADD COLUMN gate_timeout_ms BIGINT,
    ADD COLUMN map_stage TEXT,
    ADD COLUMN map_output TEXT,
    ADD COLUMN map_cap BIGINT,
    ADD COLUMN map_count BIGINT,
    ADD COLUMN lists TEXT,
    ADD CONSTRAINT jobs_gate_or_plugin CHECK ((plugin_digest IS NULL) = (gate IS NOT NULL)),
    ADD CONSTRAINT jobs_map_whole
        CHECK ((map_stage IS NULL) = (map_output IS NULL) AND (map_stage IS NULL) = (map_cap IS NULL)),
    DROP CONSTRAINT jobs_state_check,
    ADD CONSTRAINT jobs_state_check
        CHECK (state IN ('blocked', 'ready', 'running', 'awaiting', 'mapping', 'succeeded',
                         'failed', 'dead', 'cancelled'));
ALTER TABLE attempts ALTER COLUMN plugin_digest DROP NOT NULL;

-- As in 0014, except that a job with nothing left pending that is a gate
-- awaits its decision, and one that maps over a list is `mapping`, instead
-- of becoming ready: no worker claims either.
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
                            THEN CASE WHEN j.gate IS NOT NULL THEN 'awaiting'
                                      WHEN j.map_stage IS NOT NULL THEN 'mapping'
                                      ELSE 'ready' END
                            ELSE j.state END,
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

-- As in 0014, with `awaiting` and `mapping` among the states of a job not
-- done.
CREATE OR REPLACE FUNCTION ratchet_finish_runs(f_now BIGINT, f_runs TEXT[])
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
                            AND j.state IN ('blocked', 'ready', 'running', 'awaiting',
                                            'mapping', 'failed', 'dead', 'cancelled'))
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

-- As in 0006, except that a batch releasing a job that maps over a list is
-- written step by step (the expansion and the join are the store's, in
-- Rust, `store/map.rs`, on the same transaction), and that a claimed job
-- comes with the outputs later stages map over (`lists`).
DROP FUNCTION ratchet_complete_batch(
    BIGINT[], BIGINT[], TEXT[], BIGINT[], BIGINT[], TEXT[], TEXT[], BYTEA[],
    TEXT[], BIGINT[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[],
    TEXT[], TEXT[], BIGINT[], BIGINT, BIGINT[], BIGINT[], BIGINT[], BIGINT[],
    TEXT[], TEXT[], TEXT[], BIGINT[], TEXT[], TEXT[], TEXT, BIGINT, BIGINT, BIGINT,
    TEXT, BIGINT);
CREATE FUNCTION ratchet_complete_batch(
    a_job BIGINT[], a_attempt BIGINT[], a_worker TEXT[],
    p_job BIGINT[], p_attempt BIGINT[], p_output TEXT[], p_media_type TEXT[],
    p_bytes BYTEA[], p_digest TEXT[], p_now BIGINT[],
    a_run TEXT[], a_stage TEXT[], a_plugin TEXT[], a_emits TEXT[],
    o_dedup TEXT[], o_run TEXT[], o_stage TEXT[], o_event TEXT[], o_payload TEXT[],
    o_now BIGINT[], s_now BIGINT, s_jobs BIGINT[],
    t_job BIGINT[], t_attempt BIGINT[], t_now BIGINT[], t_inputs TEXT[],
    t_proposals TEXT[], t_canonical TEXT[], t_won BIGINT[],
    f_run TEXT[], f_stage TEXT[],
    claim_sql TEXT, c_now BIGINT, c_only BIGINT, c_limit BIGINT, c_worker TEXT,
    c_expires BIGINT)
RETURNS TABLE (kind TEXT, id BIGINT, run_id TEXT, stage TEXT, to_stage TEXT,
               plugin_digest TEXT, attempt BIGINT, max_attempts BIGINT,
               outputs TEXT, emits TEXT, input TEXT, from_stage TEXT, from_output TEXT,
               output TEXT, media_type TEXT, digest TEXT, size BIGINT,
               created_at BIGINT, bytes BYTEA, lists TEXT)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    r RECORD;
    pos INT;
    fenced INT := 0;
    inserted INT := 0;
    sat_run TEXT[] := '{}';
    sat_from TEXT[] := '{}';
    sat_to TEXT[] := '{}';
    ready_run TEXT[] := '{}';
    ready_stage TEXT[] := '{}';
    done_runs TEXT[];
    claimed_job BIGINT[] := '{}';
    claimed_run TEXT[] := '{}';
    claimed_stage TEXT[] := '{}';
BEGIN
    FOR r IN SELECT * FROM ratchet_fence_and_insert(a_job, a_attempt, a_worker, p_job,
                 p_attempt, p_output, p_media_type, p_bytes, p_digest, p_now)
    LOOP
        IF r.output IS NOT NULL THEN
            inserted := inserted + 1;
            CONTINUE;
        END IF;
        fenced := fenced + 1;
        pos := array_position(a_job, r.id);
        IF pos IS NULL OR r.attempt <> a_attempt[pos] OR r.run_id <> a_run[pos]
           OR r.stage <> a_stage[pos] OR r.plugin_digest <> a_plugin[pos]
           OR r.emits <> a_emits[pos] THEN
            RAISE EXCEPTION USING ERRCODE = 'RT001',
                MESSAGE = format('job %s is not the job its attempt was claimed as', r.id);
        END IF;
    END LOOP;
    IF fenced <> cardinality(a_job) OR inserted <> cardinality(p_job) THEN
        RAISE EXCEPTION USING ERRCODE = 'RT001',
            MESSAGE = format('%s of %s attempts hold their lease, %s of %s proposals are new',
                             fenced, cardinality(a_job), inserted, cardinality(p_job));
    END IF;

    FOR r IN SELECT * FROM ratchet_success_and_release(o_dedup, o_run, o_stage, o_event,
                 o_payload, o_now, s_now, s_jobs, t_job, t_attempt, t_now, t_inputs,
                 t_proposals, t_canonical, t_won, f_run, f_stage)
    LOOP
        IF r.state IS NULL THEN
            sat_run := sat_run || r.run_id;
            sat_from := sat_from || r.from_stage;
            sat_to := sat_to || r.to_stage;
        ELSIF r.state = 'ready' THEN
            ready_run := ready_run || r.run_id;
            ready_stage := ready_stage || r.to_stage;
        ELSIF r.state = 'mapping' THEN
            RAISE EXCEPTION USING ERRCODE = 'RT001',
                MESSAGE = format('stage %s maps over a list, which is expanded or joined step by step',
                                 r.to_stage);
        END IF;
    END LOOP;

    -- A run with a dependent this batch satisfied edges into is not done;
    -- any other run of the batch may be (as in store/complete.rs).
    SELECT array_agg(DISTINCT x.run) INTO done_runs
    FROM unnest(a_run) AS x(run) WHERE x.run <> ALL (sat_run);
    IF done_runs IS NOT NULL THEN
        PERFORM ratchet_finish_runs(s_now, done_runs);
    END IF;

    RETURN QUERY
        SELECT 'satisfied'::TEXT, NULL::BIGINT, s.r, NULL::TEXT, s.t, NULL::TEXT,
               NULL::BIGINT, NULL::BIGINT, NULL::TEXT, NULL::TEXT, NULL::TEXT, s.f,
               NULL::TEXT, NULL::TEXT, NULL::TEXT, NULL::TEXT, NULL::BIGINT, NULL::BIGINT,
               NULL::BYTEA, NULL::TEXT
        FROM unnest(sat_run, sat_from, sat_to) AS s(r, f, t);
    RETURN QUERY
        SELECT 'ready'::TEXT, NULL::BIGINT, s.r, NULL::TEXT, s.t, NULL::TEXT,
               NULL::BIGINT, NULL::BIGINT, NULL::TEXT, NULL::TEXT, NULL::TEXT, NULL::TEXT,
               NULL::TEXT, NULL::TEXT, NULL::TEXT, NULL::TEXT, NULL::BIGINT, NULL::BIGINT,
               NULL::BYTEA, NULL::TEXT
        FROM unnest(ready_run, ready_stage) AS s(r, t);
    IF c_limit IS NULL THEN
        RETURN;
    END IF;
    FOR r IN EXECUTE claim_sql USING c_now, c_only, c_limit, c_worker, c_expires LOOP
        kind := 'claimed';
        id := r.id;
        run_id := r.run_id;
        stage := r.stage;
        to_stage := NULL;
        plugin_digest := r.plugin_digest;
        attempt := r.attempt;
        max_attempts := r.max_attempts;
        outputs := r.outputs;
        emits := r.emits;
        lists := r.lists;
        RETURN NEXT;
        claimed_job := claimed_job || r.id;
        claimed_run := claimed_run || r.run_id;
        claimed_stage := claimed_stage || r.stage;
    END LOOP;
    RETURN QUERY
        SELECT 'input'::TEXT, i.job_id, i.run_id, i.stage, NULL::TEXT, i.plugin_digest,
               i.attempt, NULL::BIGINT, NULL::TEXT, NULL::TEXT, i.input, i.from_stage,
               i.from_output, i.output, i.media_type, i.digest, i.size, i.created_at, i.bytes,
               NULL::TEXT
        FROM ratchet_inputs_of(claimed_job, claimed_run, claimed_stage) AS i;
END
$fn$;
