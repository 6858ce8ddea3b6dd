//! `runs`, with the jobs, edges and input bindings created beside them.

use super::*;
use crate::store::repin::{self, RepinTx};
use crate::store::submit::{self, SubmitTx};

pub(super) async fn submit(store: &PostgresStore, r: RunSubmit) -> Result<RunSubmitOutcome> {
    let mut tx = store.begin_write().await?;
    let outcome = submit::submit(&mut Submitting(&mut tx), r).await?;
    if matches!(outcome, RunSubmitOutcome::Created(_)) {
        tx.commit().await?;
    }
    Ok(outcome)
}

impl crate::store::CallerTransaction for &mut sqlx::PgConnection {
    async fn run_submit(self, r: RunSubmit) -> Result<RunSubmitOutcome> {
        submit::submit(&mut Submitting(self), r).await
    }
}

/// The statements of `store::submit` on a write transaction; the rows of a
/// table go as one array per column.
struct Submitting<'t>(&'t mut sqlx::PgConnection);

impl SubmitTx for Submitting<'_> {
    async fn run_insert(&mut self, r: &RunSubmit) -> Result<bool> {
        let inserted = sqlx::query(
            "INSERT INTO runs (id, pipeline, state, idempotency_key, created_at)
             VALUES ($1, $2, 'running', $3, $4) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(&r.run_id)
        .bind(&r.pipeline)
        .bind(&r.idempotency_key)
        .bind(r.now)
        .execute(&mut *self.0)
        .await?
        .rows_affected();
        Ok(inserted > 0)
    }

    async fn run_of_key(&mut self, key: &str) -> Result<String> {
        Ok(
            sqlx::query_scalar("SELECT id FROM runs WHERE idempotency_key = $1")
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
        sqlx::query(
            "INSERT INTO jobs (run_id, stage, plugin_digest, outputs, emits, state, pending,
                               max_attempts, gate, gate_timeout_ms, map_stage, map_output,
                               map_cap, lists, next_run_at, created_at, updated_at)
             SELECT $1, j.stage, j.plugin_digest, j.outputs, j.emits, j.state, j.pending,
                    j.max_attempts, j.gate, j.gate_timeout_ms, j.map_stage, j.map_output,
                    j.map_cap, j.lists, $2, $2, $2
             FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                         $8::bigint[], $9::bigint[], $10::text[], $11::bigint[], $12::text[],
                         $13::text[], $14::bigint[], $15::text[])
                  WITH ORDINALITY AS j (stage, plugin_digest, outputs, emits, state, pending,
                                        max_attempts, gate, gate_timeout_ms, map_stage,
                                        map_output, map_cap, lists, n)
             ORDER BY j.n",
        )
        .bind(&r.run_id)
        .bind(r.now)
        .bind(column(&r.jobs, |j| j.stage.as_str()))
        .bind(column(&r.jobs, |j| j.work.plugin_digest()))
        .bind(column(&r.jobs, |j| to_json(&j.outputs)))
        .bind(column(&r.jobs, |j| to_json(&j.emits)))
        .bind(column(states, |(state, _)| *state))
        .bind(column(states, |(_, pending)| *pending))
        .bind(column(&r.jobs, |j| j.max_attempts))
        .bind(column(&r.jobs, |j| {
            j.work.gate().map(|g| g.question.as_str())
        }))
        .bind(column(&r.jobs, |j| {
            j.work.gate().and_then(|g| g.timeout_ms)
        }))
        .bind(column(&r.jobs, |j| {
            j.map.as_ref().map(|m| m.stage.as_str())
        }))
        .bind(column(&r.jobs, |j| {
            j.map.as_ref().map(|m| m.output.as_str())
        }))
        .bind(column(&r.jobs, |j| j.map.as_ref().map(|m| m.cap)))
        .bind(column(&r.jobs, |j| {
            (!j.lists.is_empty()).then(|| to_json(&j.lists))
        }))
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn edges_insert(&mut self, r: &RunSubmit) -> Result<()> {
        sqlx::query(
            "INSERT INTO edges (run_id, from_stage, to_stage, kind)
             SELECT $1, e.from_stage, e.to_stage, e.kind
             FROM UNNEST($2::text[], $3::text[], $4::text[]) AS e (from_stage, to_stage, kind)",
        )
        .bind(&r.run_id)
        .bind(column(&r.edges, |e| e.from_stage.as_str()))
        .bind(column(&r.edges, |e| e.to_stage.as_str()))
        .bind(column(&r.edges, |e| e.kind.as_str()))
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn inputs_insert(&mut self, r: &RunSubmit) -> Result<()> {
        sqlx::query(
            "INSERT INTO job_inputs (run_id, stage, input, from_stage, from_output)
             SELECT $1, b.stage, b.input, b.from_stage, b.from_output
             FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[])
                  AS b (stage, input, from_stage, from_output)",
        )
        .bind(&r.run_id)
        .bind(column(&r.inputs, |b| b.stage.as_str()))
        .bind(column(&r.inputs, |b| b.input.as_str()))
        .bind(column(&r.inputs, |b| b.from_stage.as_str()))
        .bind(column(&r.inputs, |b| b.from_output.as_str()))
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn announce_ready(&mut self) -> Result<()> {
        notify_ready(&mut *self.0).await
    }
}

pub(super) async fn get(store: &PostgresStore, run_id: &str) -> Result<Option<RunRow>> {
    let row = sqlx::query("SELECT * FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(&store.pool)
        .await?;
    row.as_ref().map(rows::run_row).transpose()
}

pub(super) async fn list(store: &PostgresStore) -> Result<Vec<RunRow>> {
    let rows = sqlx::query("SELECT * FROM runs ORDER BY created_at, id")
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::run_row).collect()
}

pub(super) async fn page(store: &PostgresStore, q: &RunQuery) -> Result<Vec<RunRow>> {
    // A key names at most one run: found through its unique index.
    let by_key = "SELECT * FROM runs
         WHERE idempotency_key = $5::TEXT AND ($1::TEXT IS NULL OR state = $1::TEXT)
           AND ($2::TEXT IS NULL OR pipeline = $2::TEXT) AND ($3::TEXT IS NULL OR id < $3::TEXT)
         LIMIT $4";
    let all = "SELECT * FROM runs
         WHERE ($1::TEXT IS NULL OR state = $1::TEXT) AND ($2::TEXT IS NULL OR pipeline = $2::TEXT)
           AND ($3::TEXT IS NULL OR id < $3::TEXT)
         ORDER BY id DESC LIMIT $4";
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

pub(super) async fn graph(pool: &PgPool, run_id: &str) -> Result<RunGraph> {
    let edges =
        sqlx::query("SELECT * FROM edges WHERE run_id = $1 ORDER BY from_stage, to_stage, kind")
            .bind(run_id)
            .fetch_all(pool)
            .await?;
    let inputs = sqlx::query("SELECT * FROM job_inputs WHERE run_id = $1 ORDER BY stage, input")
        .bind(run_id)
        .fetch_all(pool)
        .await?;
    rows::run_graph(&edges, &inputs)
}

pub(super) async fn events(store: &PostgresStore, run_id: &str) -> Result<Vec<RunEvent>> {
    let rows = sqlx::query("SELECT * FROM run_events WHERE run_id = $1 ORDER BY id")
        .bind(run_id)
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(rows::run_event).collect()
}

pub(super) async fn repin(store: &PostgresStore, r: JobRepin) -> Result<RepinOutcome> {
    let mut tx = store.begin_write().await?;
    let outcome = repin::repin(&mut Repinning(&mut tx), &r).await?;
    if outcome == RepinOutcome::Repinned {
        tx.commit().await?;
    }
    Ok(outcome)
}

/// The statements of `store::repin` on a write transaction.
struct Repinning<'t>(&'t mut Tx);

impl RepinTx for Repinning<'_> {
    async fn run_state(&mut self, run_id: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT state FROM runs WHERE id = $1 FOR NO KEY UPDATE")
                .bind(run_id)
                .fetch_optional(&mut **self.0)
                .await?,
        )
    }

    async fn job_pin(
        &mut self,
        run_id: &str,
        stage: &str,
    ) -> Result<Option<(String, Option<String>)>> {
        Ok(sqlx::query_as(
            "SELECT state, plugin_digest FROM jobs WHERE run_id = $1 AND stage = $2 FOR UPDATE",
        )
        .bind(run_id)
        .bind(stage)
        .fetch_optional(&mut **self.0)
        .await?)
    }

    async fn journaled(&mut self, run_id: &str, stage: &str) -> Result<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM model_calls WHERE run_id = $1 AND stage = $2)",
        )
        .bind(run_id)
        .bind(stage)
        .fetch_one(&mut **self.0)
        .await?)
    }

    async fn edges(&mut self, run_id: &str) -> Result<Vec<(String, String)>> {
        Ok(
            sqlx::query_as("SELECT from_stage, to_stage FROM edges WHERE run_id = $1")
                .bind(run_id)
                .fetch_all(&mut **self.0)
                .await?,
        )
    }

    async fn job_states(&mut self, run_id: &str) -> Result<Vec<(String, String)>> {
        Ok(
            sqlx::query_as("SELECT stage, state FROM jobs WHERE run_id = $1")
                .bind(run_id)
                .fetch_all(&mut **self.0)
                .await?,
        )
    }

    async fn after_edge_insert(&mut self, r: &JobRepin, from: &str, satisfied: bool) -> Result<()> {
        sqlx::query(
            "INSERT INTO edges (run_id, from_stage, to_stage, kind, satisfied)
             VALUES ($1, $2, $3, 'after', $4)",
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
            "UPDATE jobs SET plugin_digest = $1, emits = $2, updated_at = $3, pending = pending + $6,
                    state = CASE WHEN $6 > 0 THEN 'blocked' ELSE state END
             WHERE run_id = $4 AND stage = $5",
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
             VALUES ($1, $2, 'upgrade', $3, $4)",
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
