-- As in 0017, except that a claimed job taken over from an expired lease
-- comes back as `taken_over` rather than `claimed`: the claim statement
-- (`store/postgres/jobs.rs`) now says which part of the queue each job came
-- from, for the workers' count of lease takeovers (`metrics.rs`).
CREATE OR REPLACE FUNCTION ratchet_complete_batch(
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
        kind := CASE WHEN r.taken_over THEN 'taken_over' ELSE 'claimed' END;
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
