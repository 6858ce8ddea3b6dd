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

/// Every row the audit reads, from one read transaction (one snapshot).
pub(super) async fn facts(store: &SqliteStore) -> Result<AuditFacts> {
    let mut tx = store.pool.begin().await?;
    let runs = sqlx::query("SELECT * FROM runs ORDER BY created_at, id")
        .fetch_all(&mut *tx)
        .await?;
    let runs = runs.iter().map(rows::run_row).collect::<Result<Vec<_>>>()?;
    let jobs = jobs::list(&mut *tx, None).await?;
    let edges = sqlx::query("SELECT * FROM edges")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::edge_row)
        .collect::<Result<Vec<_>>>()?;
    let inputs = sqlx::query("SELECT * FROM job_inputs")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::input_row)
        .collect::<Result<Vec<_>>>()?;
    let artifacts = artifacts::list(&mut *tx, None).await?;
    let attempts = attempts(&mut *tx, None).await?;
    let outbox = outbox(&mut *tx, None).await?;
    let digest_mismatches = digest_mismatches(&mut tx).await?;
    tx.commit().await?;
    Ok(AuditFacts {
        runs,
        jobs,
        edges,
        inputs,
        artifacts,
        attempts,
        outbox,
        digest_mismatches,
    })
}

/// Artifacts whose bytes no longer hash to their digest, read a page of
/// rows at a time (SQLite has no SHA-256 of its own).
async fn digest_mismatches(tx: &mut sqlx::Transaction<'_, Sqlite>) -> Result<Vec<ArtifactMeta>> {
    const PAGE: i64 = 256;
    let mut mismatches = Vec::new();
    let mut after = i64::MIN;
    loop {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT rowid AS n, {} , bytes FROM artifacts WHERE rowid > ? ORDER BY rowid LIMIT ?",
            artifacts::META_COLUMNS
        )))
        .bind(after)
        .bind(PAGE)
        .fetch_all(&mut **tx)
        .await?;
        for row in &rows {
            after = rows::RowExt::int(row, "n")?;
            let bytes = rows::RowExt::opt_blob(row, "bytes")?.unwrap_or_default();
            let meta = rows::artifact_meta(row)?;
            if crate::digest::sha256_hex(&bytes) != meta.digest {
                mismatches.push(meta);
            }
        }
        if (rows.len() as i64) < PAGE {
            return Ok(mismatches);
        }
    }
}
