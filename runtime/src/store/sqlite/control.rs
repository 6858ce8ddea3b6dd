//! The statements of an operator's cancel or retry (`store::control`). One
//! writer commits at a time, so nothing is locked row by row.

use super::*;
use crate::store::control::{self, ControlTx};
use crate::store::map;

pub(super) async fn cancel(store: &SqliteStore, c: RunCancel) -> Result<CancelOutcome> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let outcome = control::cancel(&mut Controlling(&mut tx), &c).await?;
    if matches!(outcome, CancelOutcome::Cancelled { .. }) {
        store.commit(tx).await?;
    }
    Ok(outcome)
}

pub(super) async fn retry(store: &SqliteStore, r: RunRetry) -> Result<RetryOutcome> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let outcome = control::retry(&mut Controlling(&mut tx), &r).await?;
    if matches!(outcome, RetryOutcome::Retried(_)) {
        store.commit(tx).await?;
    }
    Ok(outcome)
}

/// The statements of `store::control` on the writer's transaction.
struct Controlling<'t, 'c>(&'t mut Tx<'c>);

impl ControlTx for Controlling<'_, '_> {
    async fn jobs_lock(&mut self, run_id: &str) -> Result<Vec<(String, String, bool, bool)>> {
        Ok(
            sqlx::query_as("SELECT stage, state, gate IS NOT NULL, map_stage IS NOT NULL FROM jobs WHERE run_id = ? ORDER BY id")
                .bind(run_id)
                .fetch_all(&mut **self.0)
                .await?,
        )
    }

    async fn run_lock(&mut self, run_id: &str) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT state FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&mut **self.0)
            .await?)
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
            "UPDATE jobs SET
                    attempt_budget = coalesce(attempt_budget, max_attempts),
                    max_attempts = attempt + coalesce(attempt_budget, max_attempts),
                    pending = w.open,
                    state = CASE WHEN w.open > 0 THEN 'blocked' ELSE ",
            released_state!(),
            " END,
                    next_run_at = ?2, lease_owner = NULL, lease_expires_at = NULL,
                    last_error = NULL, updated_at = ?2
             FROM (SELECT j.id, (SELECT COUNT(*) FROM edges e
                                 WHERE e.run_id = j.run_id AND e.to_stage = j.stage
                                   AND e.satisfied = 0) AS open
                   FROM jobs j
                   WHERE j.run_id = ?1 AND j.state IN ('failed', 'dead', 'cancelled')) AS w
             WHERE jobs.id = w.id
             RETURNING stage, state",
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
        let done = sqlx::query(
            "DELETE FROM model_calls
             WHERE run_id = ? AND stage IN (SELECT value FROM json_each(?))",
        )
        .bind(run_id)
        .bind(to_json(&stages))
        .execute(&mut **self.0)
        .await?;
        Ok(done.rows_affected())
    }

    async fn run_resume(&mut self, run_id: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "UPDATE runs SET state = 'running', finished_at = NULL, generation = generation + 1
             WHERE id = ? RETURNING generation",
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
            "INSERT INTO run_events (run_id, stage, kind, detail, at) VALUES (?, ?, ?, ?, ?)",
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
