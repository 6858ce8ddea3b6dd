//! The statements of an operator's cancel or retry (`store::control`), rows
//! locked as that module says.

use super::*;
use crate::store::control::{self, ControlTx};
use crate::store::map;

pub(super) async fn cancel(store: &PostgresStore, c: RunCancel) -> Result<CancelOutcome> {
    control::with_retries(|| async {
        let mut tx = store.begin_write().await?;
        let outcome = control::cancel(&mut Controlling(&mut tx), &c).await?;
        if matches!(outcome, CancelOutcome::Cancelled { .. }) {
            tx.commit().await?;
        }
        Ok(outcome)
    })
    .await
}

pub(super) async fn retry(store: &PostgresStore, r: RunRetry) -> Result<RetryOutcome> {
    control::with_retries(|| async {
        let mut tx = store.begin_write().await?;
        let outcome = control::retry(&mut Controlling(&mut tx), &r).await?;
        if matches!(outcome, RetryOutcome::Retried(_)) {
            notify_ready(&mut *tx).await?;
            tx.commit().await?;
        }
        Ok(outcome)
    })
    .await
}

/// The statements of `store::control` on a write transaction.
struct Controlling<'t>(&'t mut Tx);

impl ControlTx for Controlling<'_> {
    async fn jobs_lock(&mut self, run_id: &str) -> Result<Vec<(String, String, bool, bool)>> {
        Ok(sqlx::query_as(
            "SELECT stage, state, gate IS NOT NULL, map_stage IS NOT NULL FROM jobs WHERE run_id = $1 ORDER BY id FOR NO KEY UPDATE",
        )
        .bind(run_id)
        .fetch_all(&mut **self.0)
        .await?)
    }

    async fn run_lock(&mut self, run_id: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT state FROM runs WHERE id = $1 FOR NO KEY UPDATE")
                .bind(run_id)
                .fetch_optional(&mut **self.0)
                .await?,
        )
    }

    async fn attempts_cancel(&mut self, run_id: &str, error: &str, now: i64) -> Result<()> {
        fail::attempts_in_flight_end(self.0, run_id, "cancelled", error, now).await
    }

    async fn jobs_cancel(&mut self, run_id: &str, now: i64) -> Result<()> {
        fail::unfinished_jobs_cancel(self.0, run_id, "run cancelled", now).await
    }

    async fn run_cancel(&mut self, run_id: &str, now: i64) -> Result<()> {
        fail::run_end(self.0, run_id, "cancelled", now).await
    }

    async fn jobs_resume(&mut self, run_id: &str, now: i64) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(concat!(
            "UPDATE jobs j SET
                    attempt_budget = coalesce(j.attempt_budget, j.max_attempts),
                    max_attempts = j.attempt + coalesce(j.attempt_budget, j.max_attempts),
                    pending = w.open,
                    state = CASE WHEN w.open > 0 THEN 'blocked' ELSE ",
            released_state!(),
            " END,
                    next_run_at = $2, lease_owner = NULL, lease_expires_at = NULL,
                    last_error = NULL, updated_at = $2
             FROM (SELECT x.id, (SELECT COUNT(*) FROM edges e
                                 WHERE e.run_id = x.run_id AND e.to_stage = x.stage
                                   AND e.satisfied = 0) AS open
                   FROM jobs x
                   WHERE x.run_id = $1 AND x.state IN ('failed', 'dead', 'cancelled')) AS w
             WHERE j.id = w.id
             RETURNING j.stage, j.state",
        ))
        .bind(run_id)
        .bind(now)
        .fetch_all(&mut **self.0)
        .await?)
    }

    async fn maps_advance(&mut self, run_id: &str, stages: Vec<String>, now: i64) -> Result<()> {
        let keys = stages
            .into_iter()
            .map(|s| (run_id.to_string(), s))
            .collect();
        map::advance(&mut complete::Completion(self.0), keys, now).await
    }

    async fn journal_discard(&mut self, run_id: &str, stages: &[String]) -> Result<u64> {
        let done = sqlx::query("DELETE FROM model_calls WHERE run_id = $1 AND stage = ANY($2)")
            .bind(run_id)
            .bind(stages)
            .execute(&mut **self.0)
            .await?;
        Ok(done.rows_affected())
    }

    async fn run_resume(&mut self, run_id: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "UPDATE runs SET state = 'running', finished_at = NULL, generation = generation + 1
             WHERE id = $1 RETURNING generation",
        )
        .bind(run_id)
        .fetch_one(&mut **self.0)
        .await?)
    }

    async fn history_record(
        &mut self,
        run_id: &str,
        stage: Option<&str>,
        kind: &str,
        detail: &str,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO run_events (run_id, stage, kind, detail, at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(run_id)
        .bind(stage)
        .bind(kind)
        .bind(detail)
        .bind(now)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }
}
