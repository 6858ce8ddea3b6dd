//! Reconcile's batches (`store/reconcile.rs`), each one write transaction.

use async_trait::async_trait;

use super::*;
use crate::store::map;
use crate::store::reconcile::{self, ReconcileBatches, RepairTx};

/// The runs of one batch, bound as a JSON array.
const BATCH_RUNS: &str = "(SELECT value FROM json_each(?1))";

#[async_trait]
impl ReconcileBatches for SqliteStore {
    async fn end_lapsed_leases(&self, now: i64, limit: usize) -> Result<u64> {
        let mut writer = self.writer.lock().await;
        let mut tx = begin_write(&mut writer).await?;
        let mut failing = super::fail::Failing(&mut tx);
        let ended = crate::store::fail::end_lapsed_leases(&mut failing, now, limit).await?;
        self.commit(tx).await?;
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
            "SELECT id FROM runs WHERE state = 'running' AND id > ?1 ORDER BY id LIMIT ?2",
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
        let mut writer = self.writer.lock().await;
        let mut tx = begin_write(&mut writer).await?;
        reconcile::repair_runs(&mut Repairing(&mut tx), runs, now, report).await?;
        self.commit(tx).await?;
        Ok(())
    }
}

/// The statements of `store::reconcile::repair_runs` on the writer's
/// transaction; the runs are bound as a JSON array.
struct Repairing<'t, 'c>(&'t mut Tx<'c>);

impl Repairing<'_, '_> {
    /// Runs `sql`, which reads the runs from `?1` and `now` from `?2`.
    async fn update(&mut self, sql: String, runs: &[String], now: i64) -> Result<u64> {
        Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(to_json(&runs))
            .bind(now)
            .execute(&mut **self.0)
            .await?
            .rows_affected())
    }
}

impl RepairTx for Repairing<'_, '_> {
    async fn edges_repair(&mut self, runs: &[String]) -> Result<u64> {
        let sql = format!(
            "UPDATE edges SET satisfied = 1
             WHERE run_id IN {BATCH_RUNS} AND satisfied = 0
               AND EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = edges.run_id
                           AND j.stage = edges.from_stage AND j.state = 'succeeded')"
        );
        Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(to_json(&runs))
            .execute(&mut **self.0)
            .await?
            .rows_affected())
    }

    async fn pending_recount(&mut self, runs: &[String], now: i64) -> Result<u64> {
        let unsatisfied = "(SELECT COUNT(*) FROM edges e WHERE e.run_id = jobs.run_id
                            AND e.to_stage = jobs.stage AND e.satisfied = 0)";
        let sql = format!(
            "UPDATE jobs SET pending = {unsatisfied}, updated_at = ?2
             WHERE run_id IN {BATCH_RUNS} AND state = 'blocked' AND pending != {unsatisfied}"
        );
        self.update(sql, runs, now).await
    }

    async fn ready_release(&mut self, runs: &[String], now: i64) -> Result<u64> {
        let sql = format!(
            "UPDATE jobs SET state = {}, next_run_at = ?2, updated_at = ?2
             WHERE run_id IN {BATCH_RUNS} AND state = 'blocked' AND pending = 0",
            released_state!()
        );
        self.update(sql, runs, now).await
    }

    async fn maps_advance(&mut self, runs: &[String], now: i64) -> Result<()> {
        let mapping: Vec<(String, String)> = sqlx::query_as(
            "SELECT run_id, stage FROM jobs WHERE run_id IN (SELECT value FROM json_each(?)) AND state = 'mapping' ORDER BY id",
        )
        .bind(to_json(&runs))
        .fetch_all(&mut **self.0)
        .await?;
        map::advance(&mut complete::Completion(self.0), mapping, now).await
    }

    async fn runs_finish(&mut self, runs: &[String], now: i64) -> Result<u64> {
        let sql = format!(
            "UPDATE runs SET state = 'succeeded', finished_at = ?2
             WHERE id IN {BATCH_RUNS} AND state = 'running'
               AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.run_id = runs.id
                               AND jobs.state != 'succeeded')"
        );
        let finished = self.update(sql, runs, now).await?;
        if finished > 0 {
            runs::lifecycle_events(self.0, &to_json(&runs), now).await?;
        }
        Ok(finished)
    }

    /// Workers in this process are woken by its own releases; others poll.
    async fn announce_ready(&mut self) -> Result<()> {
        Ok(())
    }
}
