//! `runs`, with the jobs, edges and input bindings created beside them.

use super::*;

pub(super) async fn submit(store: &PostgresStore, r: RunSubmit) -> Result<RunSubmitOutcome> {
    let mut tx = store.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO runs (id, pipeline, state, idempotency_key, created_at)
         VALUES ($1, $2, 'running', $3, $4) ON CONFLICT (idempotency_key) DO NOTHING",
    )
    .bind(&r.run_id)
    .bind(&r.pipeline)
    .bind(&r.idempotency_key)
    .bind(r.now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        let existing: String = sqlx::query_scalar("SELECT id FROM runs WHERE idempotency_key = $1")
            .bind(&r.idempotency_key)
            .fetch_one(&mut *tx)
            .await?;
        return Ok(RunSubmitOutcome::Existing(existing));
    }
    let input = ArtifactPut {
        run_id: r.run_id.clone(),
        stage: RUN_INPUT_STAGE.to_string(),
        output: RUN_INPUT_OUTPUT.to_string(),
        media_type: "application/octet-stream".to_string(),
        digest: crate::digest::sha256_hex(&r.input),
        bytes: r.input,
        attempt: 0,
        plugin_digest: None,
        now: r.now,
    };
    artifacts::put_canonical_tx(&mut tx, &input).await?;
    for job in &r.jobs {
        let pending = r.edges.iter().filter(|e| e.to_stage == job.stage).count() as i64;
        let state = if pending == 0 { "ready" } else { "blocked" };
        sqlx::query(
            "INSERT INTO jobs (run_id, stage, plugin_digest, outputs, emits, state, pending,
                               max_attempts, next_run_at, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $9)",
        )
        .bind(&r.run_id)
        .bind(&job.stage)
        .bind(&job.plugin_digest)
        .bind(to_json(&job.outputs))
        .bind(to_json(&job.emits))
        .bind(state)
        .bind(pending)
        .bind(job.max_attempts)
        .bind(r.now)
        .execute(&mut *tx)
        .await?;
    }
    for edge in &r.edges {
        sqlx::query(
            "INSERT INTO edges (run_id, from_stage, to_stage, kind) VALUES ($1, $2, $3, $4)",
        )
        .bind(&r.run_id)
        .bind(&edge.from_stage)
        .bind(&edge.to_stage)
        .bind(edge.kind.as_str())
        .execute(&mut *tx)
        .await?;
    }
    for b in &r.inputs {
        sqlx::query(
            "INSERT INTO job_inputs (run_id, stage, input, from_stage, from_output)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&r.run_id)
        .bind(&b.stage)
        .bind(&b.input)
        .bind(&b.from_stage)
        .bind(&b.from_output)
        .execute(&mut *tx)
        .await?;
    }
    notify_ready(&mut tx).await?;
    tx.commit().await?;
    Ok(RunSubmitOutcome::Created(r.run_id))
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
