//! Reconcile's batches (`store/reconcile.rs`), each one transaction.

use async_trait::async_trait;

use super::*;
use crate::store::map;
use crate::store::reconcile::{self, ReconcileBatches, RepairTx};

#[async_trait]
impl ReconcileBatches for PostgresStore {
    async fn end_lapsed_leases(&self, now: i64, limit: usize) -> Result<u64> {
        let mut tx = self.begin_write().await?;
        let mut failing = super::fail::Failing(&mut tx);
        let ended = crate::store::fail::end_lapsed_leases(&mut failing, now, limit).await?;
        tx.commit().await?;
        Ok(ended)
    }

    async fn expired_gates(&self, now: i64, limit: usize) -> Result<Vec<ExpiredGate>> {
        super::gate::expired(self, now, limit).await
    }

    async fn gate_time_out(&self, d: &GateDecide) -> Result<GateOutcome> {
        super::gate::decide(self, d).await
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
        reconcile::repair_runs(&mut Repairing(&mut tx), runs, now, report).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// The statements of `store::reconcile::repair_runs` on a write
/// transaction.
struct Repairing<'t>(&'t mut Tx);

impl Repairing<'_> {
    /// Runs `sql`, which reads the runs from `$1` and `now` from `$2`.
    async fn update(&mut self, sql: &'static str, runs: &[String], now: i64) -> Result<u64> {
        Ok(sqlx::query(sql)
            .bind(runs)
            .bind(now)
            .execute(&mut **self.0)
            .await?
            .rows_affected())
    }
}

impl RepairTx for Repairing<'_> {
    async fn edges_repair(&mut self, runs: &[String]) -> Result<u64> {
        Ok(sqlx::query(
            "UPDATE edges SET satisfied = 1
             WHERE run_id = ANY($1) AND satisfied = 0
               AND EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = edges.run_id
                           AND j.stage = edges.from_stage AND j.state = 'succeeded')",
        )
        .bind(runs)
        .execute(&mut **self.0)
        .await?
        .rows_affected())
    }

    async fn pending_recount(&mut self, runs: &[String], now: i64) -> Result<u64> {
        let sql = "UPDATE jobs SET pending = (SELECT COUNT(*) FROM edges e
                                             WHERE e.run_id = jobs.run_id
                                               AND e.to_stage = jobs.stage AND e.satisfied = 0),
                          updated_at = $2
                   WHERE run_id = ANY($1) AND state = 'blocked'
                     AND pending != (SELECT COUNT(*) FROM edges e WHERE e.run_id = jobs.run_id
                                     AND e.to_stage = jobs.stage AND e.satisfied = 0)";
        self.update(sql, runs, now).await
    }

    async fn ready_release(&mut self, runs: &[String], now: i64) -> Result<u64> {
        let sql = concat!(
            "UPDATE jobs SET state = ",
            released_state!(),
            ", next_run_at = $2, updated_at = $2
             WHERE run_id = ANY($1) AND state = 'blocked' AND pending = 0"
        );
        self.update(sql, runs, now).await
    }

    async fn maps_advance(&mut self, runs: &[String], now: i64) -> Result<()> {
        let mapping: Vec<(String, String)> = sqlx::query_as(
            "SELECT run_id, stage FROM jobs WHERE run_id = ANY($1) AND state = 'mapping' ORDER BY id",
        )
        .bind(runs)
        .fetch_all(&mut **self.0)
        .await?;
        map::advance(&mut complete::Completion(self.0), mapping, now).await
    }

    async fn runs_finish(&mut self, runs: &[String], now: i64) -> Result<u64> {
        // Finishes them as a completion does, with their `run.succeeded`.
        let finished: i64 = sqlx::query_scalar("SELECT ratchet_finish_runs($2, $1)")
            .bind(runs)
            .bind(now)
            .fetch_one(&mut **self.0)
            .await?;
        if finished > 0 {
            announce(&mut **self.0, false, runs).await?;
        }
        Ok(u64::try_from(finished).unwrap_or(0))
    }

    async fn announce_ready(&mut self) -> Result<()> {
        notify_ready(&mut **self.0).await
    }
}
