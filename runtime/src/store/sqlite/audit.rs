//! Read-only views for `status`, `audit` and tests.

use super::*;
use crate::store::audit_run::{self, AuditTx, StageRange};

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

/// Every row of one run the audit reads (`store::audit_run`), from one read
/// transaction (one snapshot).
pub(super) async fn run(
    store: &SqliteStore,
    run_id: &str,
    visitor: &mut dyn AuditVisitor,
) -> Result<()> {
    let mut tx = store.pool.begin().await?;
    audit_run::run(&mut Auditing(&mut tx), run_id, visitor).await?;
    tx.commit().await?;
    Ok(())
}

/// The reads of `store::audit_run` on a read transaction.
struct Auditing<'t, 'c>(&'t mut sqlx::Transaction<'c, Sqlite>);

impl Auditing<'_, '_> {
    /// The rows of `sql`, which reads the run from `?1` and the page's
    /// stages `(after, last]` from `?2` and `?3`.
    async fn fetch<T>(
        &mut self,
        sql: &str,
        r: StageRange<'_>,
        map: impl Fn(&sqlx::sqlite::SqliteRow) -> Result<T>,
    ) -> Result<Vec<T>> {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(r.run_id)
            .bind(r.after)
            .bind(r.last)
            .fetch_all(&mut **self.0)
            .await?
            .iter()
            .map(map)
            .collect()
    }
}

impl AuditTx for Auditing<'_, '_> {
    async fn run(&mut self, run_id: &str) -> Result<Option<RunRow>> {
        sqlx::query("SELECT * FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&mut **self.0)
            .await?
            .as_ref()
            .map(rows::run_row)
            .transpose()
    }

    async fn run_events(&mut self, run_id: &str) -> Result<Vec<RunEvent>> {
        sqlx::query("SELECT * FROM run_events WHERE run_id = ? ORDER BY id")
            .bind(run_id)
            .fetch_all(&mut **self.0)
            .await?
            .iter()
            .map(rows::run_event)
            .collect()
    }

    /// Read a page of rows at a time: SQLite has no SHA-256 of its own.
    async fn digest_mismatches(&mut self, run_id: &str) -> Result<Vec<ArtifactMeta>> {
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
            .fetch_all(&mut **self.0)
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

    async fn orphan_artifacts(&mut self, run_id: &str) -> Result<Vec<ArtifactMeta>> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM artifacts a WHERE run_id = ?1 AND stage <> ?2
               AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = a.run_id AND j.stage = a.stage)
             ORDER BY stage, output",
            artifacts::META_COLUMNS
        )))
        .bind(run_id)
        .bind(RUN_INPUT_STAGE)
        .fetch_all(&mut **self.0)
        .await?
        .iter()
        .map(rows::artifact_meta)
        .collect()
    }

    async fn jobs_after(&mut self, run_id: &str, after: &str, limit: i64) -> Result<Vec<JobRow>> {
        sqlx::query("SELECT * FROM jobs WHERE run_id = ? AND stage > ? ORDER BY stage LIMIT ?")
            .bind(run_id)
            .bind(after)
            .bind(limit)
            .fetch_all(&mut **self.0)
            .await?
            .iter()
            .map(rows::job_row)
            .collect()
    }

    /// Through the run's jobs: the primary key starts with the job.
    async fn attempts(&mut self, r: StageRange<'_>) -> Result<Vec<AttemptRow>> {
        let sql = "SELECT a.* FROM jobs j CROSS JOIN attempts a ON a.job_id = j.id
                   WHERE j.run_id = ?1 AND j.stage > ?2 AND j.stage <= ?3 ORDER BY a.claim_seq";
        self.fetch(sql, r, rows::attempt_row).await
    }

    async fn artifacts(&mut self, r: StageRange<'_>) -> Result<Vec<ArtifactMeta>> {
        let sql = format!(
            "SELECT {} FROM artifacts WHERE run_id = ?1 AND stage > ?2 AND stage <= ?3
             ORDER BY stage, output",
            artifacts::META_COLUMNS
        );
        self.fetch(&sql, r, rows::artifact_meta).await
    }

    async fn inputs(&mut self, r: StageRange<'_>) -> Result<Vec<(InputBinding, Option<String>)>> {
        let sql = "SELECT b.*, a.digest AS source_digest FROM job_inputs b LEFT JOIN artifacts a
                     ON a.run_id = b.run_id AND a.stage = b.from_stage AND a.output = b.from_output
                   WHERE b.run_id = ?1 AND b.stage > ?2 AND b.stage <= ?3";
        self.fetch(sql, r, rows::sourced_input).await
    }

    async fn incoming(&mut self, r: StageRange<'_>) -> Result<Vec<IncomingEdges>> {
        let sql = "SELECT to_stage, COUNT(*) AS total,
                          SUM(CASE WHEN satisfied = 0 THEN 1 ELSE 0 END) AS unsatisfied
                   FROM edges WHERE run_id = ?1 AND to_stage > ?2 AND to_stage <= ?3
                   GROUP BY to_stage";
        self.fetch(sql, r, rows::incoming_edges).await
    }

    /// CROSS JOIN fixes the order: from the range of edges into the page's
    /// stages, to the attempts of each. Left to choose, the bundled SQLite
    /// took 58 ms a page at 100,000 stages (ADR 0020).
    async fn early_starts(&mut self, r: StageRange<'_>) -> Result<Vec<EarlyStart>> {
        let sql = "SELECT t.stage, a.attempt, a.claim_seq, e.from_stage, p.succeeded_seq
                   FROM edges e CROSS JOIN jobs t ON t.run_id = e.run_id AND t.stage = e.to_stage
                   CROSS JOIN attempts a ON a.job_id = t.id
                   LEFT JOIN jobs p ON p.run_id = e.run_id AND p.stage = e.from_stage
                   WHERE e.run_id = ?1 AND e.to_stage > ?2 AND e.to_stage <= ?3
                     AND (p.succeeded_seq IS NULL OR p.succeeded_seq >= a.claim_seq)
                   ORDER BY a.claim_seq, e.from_stage";
        self.fetch(sql, r, rows::early_start).await
    }

    async fn lost_edges(&mut self, r: StageRange<'_>) -> Result<Vec<NewEdge>> {
        let sql = "SELECT e.* FROM edges e
                   JOIN jobs p ON p.run_id = e.run_id AND p.stage = e.from_stage
                   WHERE e.run_id = ?1 AND e.to_stage > ?2 AND e.to_stage <= ?3
                     AND e.satisfied = 0 AND p.state = 'succeeded'
                   ORDER BY e.to_stage, e.from_stage";
        self.fetch(sql, r, |row| rows::edge_row(row).map(|(_, edge, _)| edge))
            .await
    }

    async fn outbox(&mut self, r: StageRange<'_>) -> Result<Vec<OutboxRow>> {
        let sql = "SELECT * FROM outbox WHERE run_id = ?1 AND stage > ?2 AND stage <= ?3
                   ORDER BY id";
        self.fetch(sql, r, rows::outbox_row).await
    }

    async fn lifecycle(&mut self, run_id: &str) -> Result<Vec<OutboxRow>> {
        sqlx::query("SELECT * FROM outbox WHERE run_id = ? AND stage = '' ORDER BY id")
            .bind(run_id)
            .fetch_all(&mut **self.0)
            .await?
            .iter()
            .map(rows::outbox_row)
            .collect()
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
