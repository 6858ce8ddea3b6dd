//! Reconcile's batches (`store/reconcile.rs`), each one transaction.

use async_trait::async_trait;

use super::*;
use crate::store::reconcile::ReconcileBatches;

#[async_trait]
impl ReconcileBatches for PostgresStore {
    async fn end_lapsed_leases(&self, now: i64, limit: usize) -> Result<u64> {
        let mut tx = self.begin_write().await?;
        let mut failing = super::fail::Failing(&mut tx);
        let ended = crate::store::fail::end_lapsed_leases(&mut failing, now, limit).await?;
        tx.commit().await?;
        Ok(ended)
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
