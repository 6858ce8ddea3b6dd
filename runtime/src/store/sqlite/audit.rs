//! Read-only views for `status`, `audit` and tests.

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::*;

fn attempt_row(row: &SqliteRow) -> Result<AttemptRow> {
    Ok(AttemptRow {
        job_id: row.try_get("job_id")?,
        attempt: row.try_get("attempt")?,
        run_id: row.try_get("run_id")?,
        stage: row.try_get("stage")?,
        worker: row.try_get("worker")?,
        plugin_digest: row.try_get("plugin_digest")?,
        claim_seq: row.try_get("claim_seq")?,
        claimed_at: row.try_get("claimed_at")?,
        finished_at: row.try_get("finished_at")?,
        outcome: row.try_get("outcome")?,
        error: row.try_get("error")?,
        input_digests: json_map("attempts", row.try_get("input_digests")?)?,
        proposal_digests: json_map("attempts", row.try_get("proposal_digests")?)?,
        canonical_digests: json_map("attempts", row.try_get("canonical_digests")?)?,
        proposal_won: row
            .try_get::<Option<i64>, _>("proposal_won")?
            .map(|w| w != 0),
    })
}

fn outbox_row(row: &SqliteRow) -> Result<OutboxRow> {
    Ok(OutboxRow {
        id: row.try_get("id")?,
        dedup_key: row.try_get("dedup_key")?,
        run_id: row.try_get("run_id")?,
        stage: row.try_get("stage")?,
        event: row.try_get("event")?,
        payload: row.try_get("payload")?,
        created_at: row.try_get("created_at")?,
        published_at: row.try_get("published_at")?,
    })
}

pub(super) async fn attempts<'e>(
    ex: impl sqlx::Executor<'e, Database = Sqlite>,
    run_id: Option<&str>,
) -> Result<Vec<AttemptRow>> {
    let rows =
        sqlx::query("SELECT * FROM attempts WHERE (?1 IS NULL OR run_id = ?1) ORDER BY claim_seq")
            .bind(run_id)
            .fetch_all(ex)
            .await?;
    rows.iter().map(attempt_row).collect()
}

pub(super) async fn outbox<'e>(
    ex: impl sqlx::Executor<'e, Database = Sqlite>,
    run_id: Option<&str>,
) -> Result<Vec<OutboxRow>> {
    let rows = sqlx::query("SELECT * FROM outbox WHERE (?1 IS NULL OR run_id = ?1) ORDER BY id")
        .bind(run_id)
        .fetch_all(ex)
        .await?;
    rows.iter().map(outbox_row).collect()
}

/// Every row the audit reads, from one read transaction (one snapshot).
pub(super) async fn facts(store: &SqliteStore) -> Result<AuditFacts> {
    let mut tx = store.pool.begin().await?;
    let runs = sqlx::query("SELECT * FROM runs ORDER BY created_at, id")
        .fetch_all(&mut *tx)
        .await?;
    let runs = runs.iter().map(runs::run_row).collect::<Result<Vec<_>>>()?;
    let jobs = jobs::list(&mut *tx, None).await?;
    let edges = sqlx::query("SELECT * FROM edges")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|row| {
            let kind: String = row.try_get("kind")?;
            Ok((
                row.try_get("run_id")?,
                NewEdge {
                    from_stage: row.try_get("from_stage")?,
                    to_stage: row.try_get("to_stage")?,
                    kind: if kind == "after" {
                        EdgeKind::After
                    } else {
                        EdgeKind::Data
                    },
                },
                row.try_get::<i64, _>("satisfied")? != 0,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let inputs = sqlx::query("SELECT * FROM job_inputs")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|row| {
            Ok((
                row.try_get("run_id")?,
                InputBinding {
                    stage: row.try_get("stage")?,
                    input: row.try_get("input")?,
                    from_stage: row.try_get("from_stage")?,
                    from_output: row.try_get("from_output")?,
                },
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let artifacts = artifacts::list(&mut *tx, None).await?;
    let attempts = attempts(&mut *tx, None).await?;
    let outbox = outbox(&mut *tx, None).await?;
    tx.commit().await?;
    Ok(AuditFacts {
        runs,
        jobs,
        edges,
        inputs,
        artifacts,
        attempts,
        outbox,
    })
}
