//! Read-only views for `status`, `audit` and tests.

use super::*;

pub(super) async fn attempts<'e>(
    ex: impl sqlx::Executor<'e, Database = Sqlite>,
    run_id: Option<&str>,
) -> Result<Vec<AttemptRow>> {
    let rows = match run_id {
        None => {
            sqlx::query("SELECT * FROM attempts ORDER BY claim_seq")
                .fetch_all(ex)
                .await?
        }
        // Through the run's jobs: the primary key starts with the job.
        // (`(?1 IS NULL OR run_id = ?1)` read every attempt of every run.)
        Some(run_id) => {
            sqlx::query(
                "SELECT a.* FROM jobs j CROSS JOIN attempts a ON a.job_id = j.id
                 WHERE j.run_id = ? ORDER BY a.claim_seq",
            )
            .bind(run_id)
            .fetch_all(ex)
            .await?
        }
    };
    rows.iter().map(rows::attempt_row).collect()
}

pub(super) async fn attempt<'e>(
    ex: impl sqlx::Executor<'e, Database = Sqlite>,
    job_id: i64,
    attempt: i64,
) -> Result<Option<AttemptRow>> {
    sqlx::query("SELECT * FROM attempts WHERE job_id = ? AND attempt = ?")
        .bind(job_id)
        .bind(attempt)
        .fetch_optional(ex)
        .await?
        .as_ref()
        .map(rows::attempt_row)
        .transpose()
}

pub(super) async fn outbox<'e>(
    ex: impl sqlx::Executor<'e, Database = Sqlite>,
    run_id: Option<&str>,
) -> Result<Vec<OutboxRow>> {
    let rows = sqlx::query("SELECT * FROM outbox WHERE (?1 IS NULL OR run_id = ?1) ORDER BY id")
        .bind(run_id)
        .fetch_all(ex)
        .await?;
    rows.iter().map(rows::outbox_row).collect()
}

/// Every row of one run the audit reads, from one read transaction (one
/// snapshot).
pub(super) async fn facts(store: &SqliteStore, run_id: &str) -> Result<AuditFacts> {
    let mut tx = store.pool.begin().await?;
    let runs = sqlx::query("SELECT * FROM runs WHERE id = ?")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::run_row)
        .collect::<Result<Vec<_>>>()?;
    let events = sqlx::query("SELECT * FROM run_events WHERE run_id = ? ORDER BY id")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::run_event)
        .collect::<Result<Vec<_>>>()?;
    let jobs = jobs::list(&mut *tx, Some(run_id)).await?;
    let edges = sqlx::query("SELECT * FROM edges WHERE run_id = ?")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::edge_row)
        .collect::<Result<Vec<_>>>()?;
    let inputs = sqlx::query("SELECT * FROM job_inputs WHERE run_id = ?")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::input_row)
        .collect::<Result<Vec<_>>>()?;
    let artifacts = artifacts::list(&mut *tx, Some(run_id)).await?;
    let attempts = attempts(&mut *tx, Some(run_id)).await?;
    let outbox = outbox(&mut *tx, Some(run_id)).await?;
    let digest_mismatches = digest_mismatches(&mut tx, run_id).await?;
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

/// The run's artifacts whose bytes no longer hash to their digest, read a
/// page of rows at a time (SQLite has no SHA-256 of its own).
async fn digest_mismatches(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    run_id: &str,
) -> Result<Vec<ArtifactMeta>> {
    const PAGE: i64 = 256;
    let mut mismatches = Vec::new();
    let mut after = (String::new(), String::new());
    loop {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {}, bytes FROM artifacts WHERE run_id = ?1 AND (stage, output) > (?2, ?3)
             ORDER BY stage, output LIMIT ?4",
            artifacts::META_COLUMNS
        )))
        .bind(run_id)
        .bind(&after.0)
        .bind(&after.1)
        .bind(PAGE)
        .fetch_all(&mut **tx)
        .await?;
        for row in &rows {
            let bytes = rows::RowExt::opt_blob(row, "bytes")?.unwrap_or_default();
            let meta = rows::artifact_meta(row)?;
            after = (meta.stage.clone(), meta.output.clone());
            if crate::digest::sha256_hex(&bytes) != meta.digest {
                mismatches.push(meta);
            }
        }
        if (rows.len() as i64) < PAGE {
            return Ok(mismatches);
        }
    }
}

/// Up to `limit` run ids after `after`, in id order.
pub(super) async fn run_ids(
    store: &SqliteStore,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM runs WHERE id > ?1 ORDER BY id LIMIT ?2")
            .bind(after.unwrap_or(""))
            .bind(limit as i64)
            .fetch_all(&store.pool)
            .await?,
    )
}
