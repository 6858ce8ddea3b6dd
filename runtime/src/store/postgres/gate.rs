//! The statements of deciding an approval gate (`store::gate`), rows
//! locked as that module says, and of finding the gates whose timeout
//! passed.

use std::collections::BTreeMap;

use super::*;
use crate::store::control;
use crate::store::gate::{self, GateJob, GateTx};

pub(super) async fn decide(store: &PostgresStore, d: &GateDecide) -> Result<GateOutcome> {
    control::with_retries(|| async {
        let mut tx = store.begin_write().await?;
        let outcome = gate::decide(&mut complete::Completion(&mut tx), d).await?;
        if outcome == GateOutcome::Decided {
            // An approval may have released stages (wake listening
            // workers) or ended the run (wake waiting clients).
            announce(&mut *tx, true, &[&d.run_id]).await?;
            tx.commit().await?;
        }
        Ok(outcome)
    })
    .await
}

/// Up to `limit` awaiting gates whose timeout passed by `now`, oldest
/// deadline first.
pub(super) async fn expired(
    store: &PostgresStore,
    now: i64,
    limit: usize,
) -> Result<Vec<ExpiredGate>> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT run_id, stage, gate_timeout_ms FROM jobs
         WHERE state = 'awaiting' AND gate_timeout_ms IS NOT NULL
           AND next_run_at + gate_timeout_ms <= $1
         ORDER BY next_run_at + gate_timeout_ms, id LIMIT $2",
    )
    .bind(now)
    .bind(limit as i64)
    .fetch_all(&store.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(run_id, stage, timeout_ms)| ExpiredGate {
            run_id,
            stage,
            timeout_ms,
        })
        .collect())
}

/// The statements of `store::gate` on a write transaction.
impl GateTx for complete::Completion<'_> {
    async fn gate_lock(&mut self, run_id: &str, stage: &str) -> Result<Option<GateJob>> {
        let row: Option<(i64, String, bool, i64)> = sqlx::query_as(
            "SELECT id, state, gate IS NOT NULL, attempt FROM jobs
             WHERE run_id = $1 AND stage = $2 FOR NO KEY UPDATE",
        )
        .bind(run_id)
        .bind(stage)
        .fetch_optional(&mut **self.0)
        .await?;
        Ok(row.map(|(job_id, state, is_gate, attempt)| GateJob {
            job_id,
            state,
            is_gate,
            attempt,
        }))
    }

    async fn run_exists(&mut self, run_id: &str) -> Result<bool> {
        Ok(
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM runs WHERE id = $1)")
                .bind(run_id)
                .fetch_one(&mut **self.0)
                .await?,
        )
    }

    async fn input_digests(
        &mut self,
        run_id: &str,
        stage: &str,
    ) -> Result<BTreeMap<String, String>> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT b.input, a.digest FROM job_inputs b
             JOIN artifacts a ON a.run_id = b.run_id AND a.stage = b.from_stage
                             AND a.output = b.from_output
             WHERE b.run_id = $1 AND b.stage = $2",
        )
        .bind(run_id)
        .bind(stage)
        .fetch_all(&mut **self.0)
        .await?;
        Ok(rows.into_iter().collect())
    }

    async fn decision_read(&mut self, run_id: &str, stage: &str) -> Result<Option<Vec<u8>>> {
        Ok(sqlx::query_scalar(
            "SELECT bytes FROM artifacts WHERE run_id = $1 AND stage = $2 AND output = $3",
        )
        .bind(run_id)
        .bind(stage)
        .bind(GATE_OUTPUT)
        .fetch_optional(&mut **self.0)
        .await?)
    }
}
