//! Reconcile's batches (`store/reconcile.rs`), each one transaction.

use async_trait::async_trait;
use sqlx::Row;

use super::*;
use crate::store::reconcile::{LAPSED_ON_LAST_ATTEMPT, ReconcileBatches};

#[async_trait]
impl ReconcileBatches for PostgresStore {
    async fn end_lapsed_leases(&self, now: i64, limit: usize) -> Result<u64> {
        let mut tx = self.begin_write().await?;
        let lapsed = sqlx::query(
            "SELECT id, run_id, attempt FROM jobs
             WHERE state = 'running' AND lease_expires_at <= $1 AND attempt >= max_attempts
             ORDER BY id LIMIT $2
             FOR UPDATE SKIP LOCKED",
        )
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&mut *tx)
        .await?;
        for row in &lapsed {
            let (job_id, run_id, attempt): (i64, String, i64) = (
                row.try_get("id")?,
                row.try_get("run_id")?,
                row.try_get("attempt")?,
            );
            sqlx::query(
                "UPDATE attempts SET outcome = 'lease_expired', finished_at = $1, error = $2
                 WHERE job_id = $3 AND attempt = $4 AND outcome = 'running'",
            )
            .bind(now)
            .bind(LAPSED_ON_LAST_ATTEMPT)
            .bind(job_id)
            .bind(attempt)
            .execute(&mut *tx)
            .await?;
            jobs::kill_job(&mut tx, job_id, &run_id, LAPSED_ON_LAST_ATTEMPT, now).await?;
        }
        tx.commit().await?;
        Ok(lapsed.len() as u64)
    }

    async fn running_runs(&self, after: &str, limit: usize) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM runs WHERE state = 'running' AND id > $1 ORDER BY id LIMIT $2",
        )
        .bind(after)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn repair_runs(
        &self,
        runs: &[String],
        now: i64,
        report: &mut ReconcileReport,
    ) -> Result<()> {
        let mut tx = self.begin_write().await?;
        report.edges_repaired += sqlx::query(
            "UPDATE edges SET satisfied = 1
             WHERE run_id = ANY($1) AND satisfied = 0
               AND EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = edges.run_id
                           AND j.stage = edges.from_stage AND j.state = 'succeeded')",
        )
        .bind(runs)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        report.pending_repaired += sqlx::query(
            "UPDATE jobs SET pending = (SELECT COUNT(*) FROM edges e WHERE e.run_id = jobs.run_id
                                        AND e.to_stage = jobs.stage AND e.satisfied = 0),
                    updated_at = $2
             WHERE run_id = ANY($1) AND state = 'blocked'
               AND pending != (SELECT COUNT(*) FROM edges e WHERE e.run_id = jobs.run_id
                               AND e.to_stage = jobs.stage AND e.satisfied = 0)",
        )
        .bind(runs)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let ready = sqlx::query(
            "UPDATE jobs SET state = 'ready', next_run_at = $2, updated_at = $2
             WHERE run_id = ANY($1) AND state = 'blocked' AND pending = 0",
        )
        .bind(runs)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        report.pending_repaired += ready;
        report.runs_finished += sqlx::query(
            "UPDATE runs SET state = 'succeeded', finished_at = $2
             WHERE id = ANY($1) AND state = 'running'
               AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.run_id = runs.id
                               AND jobs.state != 'succeeded')",
        )
        .bind(runs)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if ready > 0 {
            notify_ready(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
