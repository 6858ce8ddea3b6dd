-- The statements of a batch of completions, as functions (ADR 0010).
--
-- Each of them looks rows up by key: the batch's jobs by id, their
-- artifacts, attempts, outbox rows and edges by primary key, the
-- dependents and runs by key. Their plans are made once per connection
-- (`force_generic_plan`) and always walk the batch's keys and probe an
-- index for each (no sequential scans, hash or merge joins), whatever the
-- tables' size or statistics: planning one of these statements afresh
-- cost more than running it. The claim is not one of them: which jobs it
-- takes depends on the data there is now, and it is planned for it at each
-- execution (ADR 0009).
--
-- The store calls the step functions one by one when it must read back
-- artifacts that won (store/complete.rs), and `ratchet_complete_batch` when
-- it need not: then the whole batch, the claim after it and the claimed
-- jobs' inputs are one round trip. `ratchet_inputs_of` also serves a job's
-- inputs read on their own.

-- The fence locks the job rows of the attempts that hold their lease in id
-- order (`MATERIALIZED` keeps that step whole, and the insert reads it);
-- the insert stores each proposal of a fenced attempt under its job's run
-- and stage unless the key is taken. Rows of both come back: a fenced job
-- has an `id`, an inserted artifact an `output`.
CREATE FUNCTION ratchet_fence_and_insert(
    a_job BIGINT[], a_attempt BIGINT[], a_worker TEXT[],
    p_job BIGINT[], p_attempt BIGINT[], p_output TEXT[], p_media_type TEXT[],
    p_bytes BYTEA[], p_digest TEXT[], p_now BIGINT[])
RETURNS TABLE (id BIGINT, attempt BIGINT, run_id TEXT, stage TEXT, plugin_digest TEXT,
               emits TEXT, output TEXT, digest TEXT)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH fenced AS MATERIALIZED (
        SELECT j.id, j.attempt, j.run_id, j.stage, j.plugin_digest, j.emits
        FROM jobs j
        JOIN UNNEST(a_job, a_attempt, a_worker) AS k(id, attempt, worker)
          ON j.id = k.id AND j.attempt = k.attempt AND j.lease_owner = k.worker
        WHERE j.state = 'running'
        ORDER BY j.id
        FOR UPDATE OF j
    ), inserted AS (
        INSERT INTO artifacts (run_id, stage, output, media_type, bytes, digest, size,
                               attempt, plugin_digest, created_at)
        SELECT f.run_id, f.stage, p.output, p.media_type, p.bytes, p.digest,
               OCTET_LENGTH(p.bytes), p.attempt, f.plugin_digest, p.now
        FROM UNNEST(p_job, p_attempt, p_output, p_media_type, p_bytes, p_digest, p_now)
             AS p(job_id, attempt, output, media_type, bytes, digest, now)
        JOIN fenced f ON f.id = p.job_id AND f.attempt = p.attempt
        ON CONFLICT (run_id, stage, output) DO NOTHING
        RETURNING run_id, stage, output, digest
    )
    SELECT f.id, f.attempt, f.run_id, f.stage, f.plugin_digest, f.emits,
           NULL::TEXT, NULL::TEXT
    FROM fenced f
    UNION ALL
    SELECT NULL, NULL, i.run_id, i.stage, NULL, NULL, i.output, i.digest FROM inserted i;
END
$fn$;

-- What the live attempts' success means, once their outputs are stored:
-- the outbox rows, the jobs succeeded (taking values of the order shared by
-- claims and completions in the order given, as on SQLite), the attempts'
-- rows and the edges out of them satisfied. The dependents those edges
-- point to are locked in `(run, stage)` order (`MATERIALIZED` keeps that
-- lock step whole), and the decrement then reads each locked row's latest
-- version, so two predecessors finishing at once cannot both miss each
-- other (a recount could, under READ COMMITTED). A dependent is never one
-- of the jobs succeeding: it is blocked until they have. Rows of both come
-- back: a dependent has a `state`.
CREATE FUNCTION ratchet_success_and_release(
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
    WITH outbox_rows AS (
        INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
        SELECT * FROM UNNEST(o_dedup, o_run, o_stage, o_event, o_payload, o_now)
        ON CONFLICT (dedup_key) DO NOTHING
    ), succeeded AS (
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
END
$fn$;

-- Finishes each run of `f_runs` that has no job left to do. The run rows are
-- locked first: the last two completions of a run then see each other's
-- commits, and one of them finishes the run.
CREATE FUNCTION ratchet_finish_runs(f_now BIGINT, f_runs TEXT[])
RETURNS VOID
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
AS $fn$
BEGIN
    PERFORM 1 FROM runs r WHERE r.id = ANY(f_runs) ORDER BY r.id FOR NO KEY UPDATE;
    UPDATE runs r SET state = 'succeeded', finished_at = f_now
    WHERE r.id = ANY(f_runs) AND r.state = 'running'
      AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = r.id
                        AND j.state IN ('blocked', 'ready', 'running', 'failed', 'dead',
                                        'cancelled'));
END
$fn$;

-- The canonical inputs of each job `i_job` (stage `i_stage` of run `i_run`):
-- each input binding with the stored artifact it names (NULL when there is
-- none, a broken invariant the scheduler reports), by job, then by input.
CREATE FUNCTION ratchet_inputs_of(i_job BIGINT[], i_run TEXT[], i_stage TEXT[])
RETURNS TABLE (job_id BIGINT, input TEXT, from_stage TEXT, from_output TEXT, run_id TEXT,
               stage TEXT, output TEXT, media_type TEXT, digest TEXT, size BIGINT,
               attempt BIGINT, plugin_digest TEXT, created_at BIGINT, bytes BYTEA)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.job, b.input, b.from_stage, b.from_output, a.run_id, a.stage, a.output,
           a.media_type, a.digest, a.size, a.attempt, a.plugin_digest, a.created_at, a.bytes
    FROM UNNEST(i_job, i_run, i_stage) AS k(job, run, stage)
    JOIN job_inputs b ON b.run_id = k.run AND b.stage = k.stage
    LEFT JOIN artifacts a
      ON a.run_id = b.run_id AND a.stage = b.from_stage AND a.output = b.from_output
    ORDER BY k.job, b.input;
END
$fn$;

-- A batch and the claim after it, in one call, when every attempt still
-- holds its lease on the job its claim returned (`a_run`, `a_stage`,
-- `a_plugin`, `a_emits`: the outbox rows were made from them) and every
-- proposal is inserted. Otherwise it raises SQLSTATE RT001, the call's
-- transaction rolls back, and the store runs the steps one by one.
-- `claim_sql` is the store's claim statement (postgres/jobs.rs), run by
-- `EXECUTE` so that it is planned for the data there is now, with
-- `c_now`, `c_only`, `c_limit`, `c_worker`, `c_expires`; no claim when
-- `c_limit` is NULL. Returns rows of four kinds: `satisfied` (run_id,
-- from_stage, to_stage), `ready` (run_id, to_stage), `claimed`
-- (the claim's columns, in its order) and `input` (`id` the claimed job,
-- the other columns those of `ratchet_inputs_of`): a claimed job starts
-- without reading its inputs in a round trip of its own.
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
               created_at BIGINT, bytes BYTEA)
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
               NULL::BYTEA
        FROM unnest(sat_run, sat_from, sat_to) AS s(r, f, t);
    RETURN QUERY
        SELECT 'ready'::TEXT, NULL::BIGINT, s.r, NULL::TEXT, s.t, NULL::TEXT,
               NULL::BIGINT, NULL::BIGINT, NULL::TEXT, NULL::TEXT, NULL::TEXT, NULL::TEXT,
               NULL::TEXT, NULL::TEXT, NULL::TEXT, NULL::TEXT, NULL::BIGINT, NULL::BIGINT,
               NULL::BYTEA
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
        RETURN NEXT;
        claimed_job := claimed_job || r.id;
        claimed_run := claimed_run || r.run_id;
        claimed_stage := claimed_stage || r.stage;
    END LOOP;
    RETURN QUERY
        SELECT 'input'::TEXT, i.job_id, i.run_id, i.stage, NULL::TEXT, i.plugin_digest,
               i.attempt, NULL::BIGINT, NULL::TEXT, NULL::TEXT, i.input, i.from_stage,
               i.from_output, i.output, i.media_type, i.digest, i.size, i.created_at, i.bytes
        FROM ratchet_inputs_of(claimed_job, claimed_run, claimed_stage) AS i;
END
$fn$;
