//! Read-only views for `status`, `audit` and tests.

use super::*;

pub(super) async fn attempts<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    run_id: Option<&str>,
) -> Result<Vec<AttemptRow>> {
    let rows = sqlx::query(
        "SELECT * FROM attempts WHERE ($1::TEXT IS NULL OR run_id = $1) ORDER BY claim_seq",
    )
    .bind(run_id)
    .fetch_all(ex)
    .await?;
    rows.iter().map(rows::attempt_row).collect()
}

pub(super) async fn attempt<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    job_id: i64,
    attempt: i64,
) -> Result<Option<AttemptRow>> {
    sqlx::query("SELECT * FROM attempts WHERE job_id = $1 AND attempt = $2")
        .bind(job_id)
        .bind(attempt)
        .fetch_optional(ex)
        .await?
        .as_ref()
        .map(rows::attempt_row)
        .transpose()
}

pub(super) async fn outbox<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    run_id: Option<&str>,
) -> Result<Vec<OutboxRow>> {
    let rows =
        sqlx::query("SELECT * FROM outbox WHERE ($1::TEXT IS NULL OR run_id = $1) ORDER BY id")
            .bind(run_id)
            .fetch_all(ex)
            .await?;
    rows.iter().map(rows::outbox_row).collect()
}

/// Every row of one run the audit reads, from one REPEATABLE READ
/// snapshot.
pub(super) async fn facts(store: &PostgresStore, run_id: &str) -> Result<AuditFacts> {
    let mut tx = store
        .pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let runs = sqlx::query("SELECT * FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::run_row)
        .collect::<Result<Vec<_>>>()?;
    let events = sqlx::query("SELECT * FROM run_events WHERE run_id = $1 ORDER BY id")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::run_event)
        .collect::<Result<Vec<_>>>()?;
    let jobs = jobs::list(&mut *tx, Some(run_id)).await?;
    let edges = sqlx::query("SELECT * FROM edges WHERE run_id = $1")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::edge_row)
        .collect::<Result<Vec<_>>>()?;
    let inputs = sqlx::query("SELECT * FROM job_inputs WHERE run_id = $1")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::input_row)
        .collect::<Result<Vec<_>>>()?;
    let artifacts = artifacts::list(&mut *tx, Some(run_id)).await?;
    let attempts = attempts(&mut *tx, Some(run_id)).await?;
    let outbox = outbox(&mut *tx, Some(run_id)).await?;
    let digest_mismatches = sqlx::query(
        "SELECT run_id, stage, output, media_type, digest, size, attempt, plugin_digest, created_at
         FROM artifacts WHERE run_id = $1 AND encode(sha256(bytes), 'hex') <> digest
         ORDER BY stage, output",
    )
    .bind(run_id)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(rows::artifact_meta)
    .collect::<Result<Vec<_>>>()?;
    tx.commit().await?;
    Ok(AuditFacts {
        runs,
        events,
        jobs,
        edges,
        inputs,
        artifacts,
        attempts,
        outbox,
        digest_mismatches,
    })
}

/// Up to `limit` run ids after `after`, in id order.
pub(super) async fn run_ids(
    store: &PostgresStore,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM runs WHERE id > $1 ORDER BY id LIMIT $2")
            .bind(after.unwrap_or(""))
            .bind(limit as i64)
            .fetch_all(&store.pool)
            .await?,
    )
}
