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
/// snapshot), a page of jobs at a time.
pub(super) async fn run(
    store: &SqliteStore,
    run_id: &str,
    visitor: &mut dyn AuditVisitor,
) -> Result<()> {
    let mut tx = store.pool.begin().await?;
    let Some(run) = sqlx::query("SELECT * FROM runs WHERE id = ?")
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?
    else {
        return Ok(());
    };
    let events = sqlx::query("SELECT * FROM run_events WHERE run_id = ? ORDER BY id")
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::run_event)
        .collect::<Result<Vec<_>>>()?;
    let orphan_artifacts = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {} FROM artifacts a WHERE run_id = ?1 AND stage <> ?2
           AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = a.run_id AND j.stage = a.stage)
         ORDER BY stage, output",
        artifacts::META_COLUMNS
    )))
    .bind(run_id)
    .bind(RUN_INPUT_STAGE)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(rows::artifact_meta)
    .collect::<Result<Vec<_>>>()?;
    visitor.run(RunAuditFacts {
        run: rows::run_row(&run)?,
        events,
        digest_mismatches: digest_mismatches(&mut tx, run_id).await?,
        orphan_artifacts,
    });
    let mut after = String::new();
    loop {
        let jobs =
            sqlx::query("SELECT * FROM jobs WHERE run_id = ? AND stage > ? ORDER BY stage LIMIT ?")
                .bind(run_id)
                .bind(&after)
                .bind(AUDIT_PAGE_JOBS)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(rows::job_row)
                .collect::<Result<Vec<_>>>()?;
        let Some(last) = jobs.last().map(|j| j.stage.clone()) else {
            break;
        };
        let page = stage_page(&mut tx, run_id, &after, &last, jobs).await?;
        let full = page.jobs.len() as i64 == AUDIT_PAGE_JOBS;
        visitor.stages(page);
        if !full {
            break;
        }
        after = last;
    }
    tx.commit().await?;
    Ok(())
}

/// The rows of the jobs whose stages fall in `(after, last]`.
async fn stage_page(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    run_id: &str,
    after: &str,
    last: &str,
    jobs: Vec<JobRow>,
) -> Result<StageAuditPage> {
    async fn fetch<T>(
        tx: &mut sqlx::Transaction<'_, Sqlite>,
        sql: &str,
        (run_id, after, last): (&str, &str, &str),
        map: impl Fn(&sqlx::sqlite::SqliteRow) -> Result<T>,
    ) -> Result<Vec<T>> {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run_id)
            .bind(after)
            .bind(last)
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(map)
            .collect()
    }
    let range = (run_id, after, last);
    Ok(StageAuditPage {
        // Through the run's jobs: the primary key starts with the job.
        attempts: fetch(
            tx,
            "SELECT a.* FROM jobs j CROSS JOIN attempts a ON a.job_id = j.id
             WHERE j.run_id = ?1 AND j.stage > ?2 AND j.stage <= ?3 ORDER BY a.claim_seq",
            range,
            rows::attempt_row,
        )
        .await?,
        artifacts: fetch(
            tx,
            &format!(
                "SELECT {} FROM artifacts WHERE run_id = ?1 AND stage > ?2 AND stage <= ?3
                 ORDER BY stage, output",
                artifacts::META_COLUMNS
            ),
            range,
            rows::artifact_meta,
        )
        .await?,
        inputs: fetch(
            tx,
            "SELECT b.*, a.digest AS source_digest FROM job_inputs b LEFT JOIN artifacts a
               ON a.run_id = b.run_id AND a.stage = b.from_stage AND a.output = b.from_output
             WHERE b.run_id = ?1 AND b.stage > ?2 AND b.stage <= ?3",
            range,
            rows::sourced_input,
        )
        .await?,
        incoming: fetch(
            tx,
            "SELECT to_stage, COUNT(*) AS total,
                    SUM(CASE WHEN satisfied = 0 THEN 1 ELSE 0 END) AS unsatisfied
             FROM edges WHERE run_id = ?1 AND to_stage > ?2 AND to_stage <= ?3 GROUP BY to_stage",
            range,
            rows::incoming_edges,
        )
        .await?,
        early_starts: fetch(
            tx,
            // CROSS JOIN fixes the order: from the range of edges into the
            // page's stages, to the attempts of each. Left to choose, the
            // bundled SQLite took 58 ms a page at 100,000 stages (20 s for
            // the audit, 4 s of it the rest).
            "SELECT t.stage, a.attempt, a.claim_seq, e.from_stage, p.succeeded_seq
             FROM edges e CROSS JOIN jobs t ON t.run_id = e.run_id AND t.stage = e.to_stage
             CROSS JOIN attempts a ON a.job_id = t.id
             LEFT JOIN jobs p ON p.run_id = e.run_id AND p.stage = e.from_stage
             WHERE e.run_id = ?1 AND e.to_stage > ?2 AND e.to_stage <= ?3
               AND (p.succeeded_seq IS NULL OR p.succeeded_seq >= a.claim_seq)
             ORDER BY a.claim_seq, e.from_stage",
            range,
            rows::early_start,
        )
        .await?,
        lost_edges: fetch(
            tx,
            "SELECT e.* FROM edges e JOIN jobs p ON p.run_id = e.run_id AND p.stage = e.from_stage
             WHERE e.run_id = ?1 AND e.to_stage > ?2 AND e.to_stage <= ?3
               AND e.satisfied = 0 AND p.state = 'succeeded'
             ORDER BY e.to_stage, e.from_stage",
            range,
            |row| rows::edge_row(row).map(|(_, edge, _)| edge),
        )
        .await?,
        outbox: fetch(
            tx,
            "SELECT * FROM outbox WHERE run_id = ?1 AND stage > ?2 AND stage <= ?3 ORDER BY id",
            range,
            rows::outbox_row,
        )
        .await?,
        jobs,
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
