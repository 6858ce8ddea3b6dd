//! `runs`, with the jobs, edges and input bindings created beside them.

use super::*;
use crate::store::repin::{self, RepinTx};
use crate::store::submit::{self, SubmitTx};

pub(super) async fn submit(store: &SqliteStore, r: RunSubmit) -> Result<RunSubmitOutcome> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let outcome = submit::submit(&mut Submitting(&mut tx), r).await?;
    if matches!(outcome, RunSubmitOutcome::Created(_)) {
        store.commit(tx).await?;
    }
    Ok(outcome)
}

impl crate::store::CallerTransaction for &mut SqliteConnection {
    async fn run_submit(self, r: RunSubmit) -> Result<RunSubmitOutcome> {
        submit::submit(&mut Submitting(self), r).await
    }
}

/// The statements of `store::submit` on the writer's transaction; the rows
/// of a table go as one JSON list (see `complete.rs`).
struct Submitting<'t>(&'t mut SqliteConnection);

impl Submitting<'_> {
    /// A run's rows of one table in one statement: `sql` reads the run's id
    /// from `?1` and the rows, a JSON list, from `?2`.
    async fn insert_rows(&mut self, sql: &'static str, run_id: &str, rows: String) -> Result<()> {
        sqlx::query(sql)
            .bind(run_id)
            .bind(rows)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }
}

impl SubmitTx for Submitting<'_> {
    async fn run_insert(&mut self, r: &RunSubmit) -> Result<bool> {
        let inserted = sqlx::query(
            "INSERT INTO runs (id, pipeline, state, idempotency_key, created_at, unfinished)
             VALUES (?, ?, 'running', ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(&r.run_id)
        .bind(&r.pipeline)
        .bind(&r.idempotency_key)
        .bind(r.now)
        .bind(r.jobs.len() as i64)
        .execute(&mut *self.0)
        .await?
        .rows_affected();
        Ok(inserted > 0)
    }

    async fn run_of_key(&mut self, key: &str) -> Result<String> {
        Ok(
            sqlx::query_scalar("SELECT id FROM runs WHERE idempotency_key = ?")
                .bind(key)
                .fetch_one(&mut *self.0)
                .await?,
        )
    }

    async fn input_insert(&mut self, input: ArtifactPut<'_>) -> Result<()> {
        crate::store::canonical::put(&mut artifacts::Canonical(&mut *self.0), input).await?;
        Ok(())
    }

    async fn jobs_insert(&mut self, r: &RunSubmit, states: &[(&str, i64)]) -> Result<()> {
        let jobs: Vec<_> = r
            .jobs
            .iter()
            .zip(states)
            .map(|(job, (state, pending))| {
                let (outputs, emits) = (to_json(&job.outputs), to_json(&job.emits));
                let gate = job.work.gate();
                (
                    (&job.stage, job.work.plugin_digest(), outputs, emits),
                    (state, pending, job.max_attempts),
                    (gate.map(|g| &g.question), gate.and_then(|g| g.timeout_ms)),
                    job.map.as_ref().map(|m| (&m.stage, &m.output, m.cap)),
                    (!job.lists.is_empty()).then(|| to_json(&job.lists)),
                )
            })
            .collect();
        sqlx::query(
            "INSERT INTO jobs (run_id, stage, plugin_digest, outputs, emits, state, pending,
                               max_attempts, gate, gate_timeout_ms, map_stage, map_output,
                               map_cap, lists, next_run_at, created_at, updated_at)
             SELECT ?1, j.value ->> '$[0][0]', j.value ->> '$[0][1]', j.value ->> '$[0][2]',
                    j.value ->> '$[0][3]', j.value ->> '$[1][0]', j.value ->> '$[1][1]',
                    j.value ->> '$[1][2]', j.value ->> '$[2][0]', j.value ->> '$[2][1]',
                    j.value ->> '$[3][0]', j.value ->> '$[3][1]', j.value ->> '$[3][2]',
                    j.value ->> '$[4]', ?2, ?2, ?2
             FROM jsonb_each(?3) AS j ORDER BY j.key",
        )
        .bind(&r.run_id)
        .bind(r.now)
        .bind(to_json(&jobs))
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn edges_insert(&mut self, r: &RunSubmit) -> Result<()> {
        let edges: Vec<_> = r
            .edges
            .iter()
            .map(|e| (&e.from_stage, &e.to_stage, e.kind.as_str()))
            .collect();
        self.insert_rows(
            "INSERT INTO edges (run_id, from_stage, to_stage, kind)
             SELECT ?1, e.value ->> 0, e.value ->> 1, e.value ->> 2 FROM jsonb_each(?2) AS e",
            &r.run_id,
            to_json(&edges),
        )
        .await
    }

    async fn inputs_insert(&mut self, r: &RunSubmit) -> Result<()> {
        let inputs: Vec<_> = r
            .inputs
            .iter()
            .map(|b| (&b.stage, &b.input, &b.from_stage, &b.from_output))
            .collect();
        self.insert_rows(
            "INSERT INTO job_inputs (run_id, stage, input, from_stage, from_output)
             SELECT ?1, b.value ->> 0, b.value ->> 1, b.value ->> 2, b.value ->> 3
             FROM jsonb_each(?2) AS b",
            &r.run_id,
            to_json(&inputs),
        )
        .await
    }

    /// Workers in this process are woken by the submitter; others poll.
    async fn announce_ready(&mut self) -> Result<()> {
        Ok(())
    }
}

pub(super) async fn get(store: &SqliteStore, run_id: &str) -> Result<Option<RunRow>> {
    let row = sqlx::query("SELECT * FROM runs WHERE id = ?")
        .bind(run_id)
        .fetch_optional(&store.pool)
        .await?;
    row.as_ref().map(rows::run_row).transpose()
}

pub(super) async fn list(store: &SqliteStore) -> Result<Vec<RunRow>> {
    let rows = sqlx::query("SELECT * FROM runs ORDER BY created_at, id")
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::run_row).collect()
}

pub(super) async fn page(store: &SqliteStore, q: &RunQuery) -> Result<Vec<RunRow>> {
    // A key names at most one run: found through its unique index.
    let by_key = "SELECT * FROM runs
         WHERE idempotency_key = ?5 AND (?1 IS NULL OR state = ?1)
           AND (?2 IS NULL OR pipeline = ?2) AND (?3 IS NULL OR id < ?3) LIMIT ?4";
    let all = "SELECT * FROM runs
         WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR pipeline = ?2)
           AND (?3 IS NULL OR id < ?3)
         ORDER BY id DESC LIMIT ?4";
    let mut query = sqlx::query(if q.key.is_some() { by_key } else { all })
        .bind(q.state.map(RunState::as_str))
        .bind(q.pipeline.as_deref())
        .bind(q.before.as_deref())
        .bind(i64::try_from(q.limit).unwrap_or(i64::MAX));
    if let Some(key) = &q.key {
        query = query.bind(key);
    }
    let rows = query.fetch_all(&store.pool).await?;
    rows.iter().map(rows::run_row).collect()
}

pub(super) async fn graph(pool: &SqlitePool, run_id: &str) -> Result<RunGraph> {
    let edges =
        sqlx::query("SELECT * FROM edges WHERE run_id = ? ORDER BY from_stage, to_stage, kind")
            .bind(run_id)
            .fetch_all(pool)
            .await?;
    let inputs = sqlx::query("SELECT * FROM job_inputs WHERE run_id = ? ORDER BY stage, input")
        .bind(run_id)
        .fetch_all(pool)
        .await?;
    rows::run_graph(&edges, &inputs)
}

pub(super) async fn events(store: &SqliteStore, run_id: &str) -> Result<Vec<RunEvent>> {
    let rows = sqlx::query("SELECT * FROM run_events WHERE run_id = ? ORDER BY id")
        .bind(run_id)
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::run_event).collect()
}

pub(super) async fn repin(store: &SqliteStore, r: JobRepin) -> Result<RepinOutcome> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let outcome = repin::repin(&mut Repinning(&mut tx), &r).await?;
    if outcome == RepinOutcome::Repinned {
        store.commit(tx).await?;
    }
    Ok(outcome)
}

/// The statements of `store::repin` on a write transaction.
struct Repinning<'t, 'c>(&'t mut Tx<'c>);

impl RepinTx for Repinning<'_, '_> {
    async fn run_state(&mut self, run_id: &str) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT state FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&mut **self.0)
            .await?)
    }

    async fn job_pin(
        &mut self,
        run_id: &str,
        stage: &str,
    ) -> Result<Option<(String, Option<String>)>> {
        Ok(
            sqlx::query_as("SELECT state, plugin_digest FROM jobs WHERE run_id = ? AND stage = ?")
                .bind(run_id)
                .bind(stage)
                .fetch_optional(&mut **self.0)
                .await?,
        )
    }

    async fn journaled(&mut self, run_id: &str, stage: &str) -> Result<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM model_calls WHERE run_id = ? AND stage = ?)",
        )
        .bind(run_id)
        .bind(stage)
        .fetch_one(&mut **self.0)
        .await?)
    }

    async fn edges(&mut self, run_id: &str) -> Result<Vec<(String, String)>> {
        Ok(
            sqlx::query_as("SELECT from_stage, to_stage FROM edges WHERE run_id = ?")
                .bind(run_id)
                .fetch_all(&mut **self.0)
                .await?,
        )
    }

    async fn job_states(&mut self, run_id: &str) -> Result<Vec<(String, String)>> {
        Ok(
            sqlx::query_as("SELECT stage, state FROM jobs WHERE run_id = ?")
                .bind(run_id)
                .fetch_all(&mut **self.0)
                .await?,
        )
    }

    async fn after_edge_insert(&mut self, r: &JobRepin, from: &str, satisfied: bool) -> Result<()> {
        sqlx::query(
            "INSERT INTO edges (run_id, from_stage, to_stage, kind, satisfied)
             VALUES (?, ?, ?, 'after', ?)",
        )
        .bind(&r.run_id)
        .bind(from)
        .bind(&r.stage)
        .bind(i64::from(satisfied))
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn job_repin(&mut self, r: &JobRepin, waits: i64) -> Result<()> {
        sqlx::query(
            "UPDATE jobs SET plugin_digest = ?1, emits = ?2, updated_at = ?3, pending = pending + ?6,
                    state = CASE WHEN ?6 > 0 THEN 'blocked' ELSE state END
             WHERE run_id = ?4 AND stage = ?5",
        )
        .bind(&r.to_digest)
        .bind(to_json(&r.emits))
        .bind(r.now)
        .bind(&r.run_id)
        .bind(&r.stage)
        .bind(waits)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn upgrade_record(&mut self, r: &JobRepin) -> Result<()> {
        sqlx::query(
            "INSERT INTO run_events (run_id, stage, kind, detail, at)
             VALUES (?, ?, 'upgrade', ?, ?)",
        )
        .bind(&r.run_id)
        .bind(&r.stage)
        .bind(&r.detail)
        .bind(r.now)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }
}

/// The lifecycle event of each run of `runs` (a JSON list of ids) that has
/// finished, `run.succeeded`, `run.failed` or `run.cancelled`, written in
/// the transaction that finished it; writing it twice writes it once.
/// PostgreSQL's `ratchet_lifecycle_events` (migrations 0014, 0016) says
/// what it holds.
pub(super) async fn lifecycle_events(
    conn: &mut sqlx::SqliteConnection,
    runs: &str,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
         SELECT r.id || '/run.' || r.state || '#' || r.generation, r.id, '', 'run.' || r.state,
                json_patch('{}', json_object(
                    'state', r.state, 'pipeline', r.pipeline, 'generation', r.generation,
                    'failed_stage', (SELECT j.stage FROM jobs j WHERE j.run_id = r.id
                                       AND j.state = 'dead' ORDER BY j.id LIMIT 1),
                    'error', (SELECT j.last_error FROM jobs j WHERE j.run_id = r.id
                                AND j.state = 'dead' ORDER BY j.id LIMIT 1))),
                ?2
         FROM runs r
         WHERE r.id IN (SELECT value FROM json_each(?1))
           AND r.state IN ('succeeded', 'failed', 'cancelled')
         ORDER BY r.id
         ON CONFLICT (dedup_key) DO NOTHING",
    )
    .bind(runs)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}
