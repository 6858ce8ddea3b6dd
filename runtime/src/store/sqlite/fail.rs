//! The statements of failing (`store::fail`): a failed attempt, a lease
//! that lapsed on its job's last attempt.

use super::*;
use crate::store::fail::{self, FailTx, FencedJob, LapsedLease};

pub(super) async fn fail(store: &SqliteStore, f: JobFail) -> Result<FailOutcome> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let outcome = fail::fail(&mut Failing(&mut tx), &f).await?;
    if outcome != FailOutcome::LeaseLost {
        store.commit(tx).await?;
    }
    Ok(outcome)
}

/// The statements of `store::fail` on the writer's transaction.
pub(super) struct Failing<'t, 'c>(pub &'t mut Tx<'c>);

impl FailTx for Failing<'_, '_> {
    async fn fence(
        &mut self,
        job_id: i64,
        attempt: i64,
        worker: &str,
    ) -> Result<Option<FencedJob>> {
        let row = sqlx::query(
            "SELECT run_id, max_attempts FROM jobs
             WHERE id = ? AND attempt = ? AND lease_owner = ? AND state = 'running'",
        )
        .bind(job_id)
        .bind(attempt)
        .bind(worker)
        .fetch_optional(&mut **self.0)
        .await?;
        row.as_ref().map(rows::fenced_job).transpose()
    }

    async fn job_retry(&mut self, f: &JobFail) -> Result<()> {
        sqlx::query(
            "UPDATE jobs SET state = 'ready', lease_owner = NULL, lease_expires_at = NULL,
                    next_run_at = ?, last_error = ?, updated_at = ?
             WHERE id = ?",
        )
        .bind(f.retry_at)
        .bind(&f.error)
        .bind(f.now)
        .bind(f.job_id)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn job_dead(&mut self, job_id: i64, error: &str, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE jobs SET state = 'dead', lease_owner = NULL, lease_expires_at = NULL,
                    last_error = ?, updated_at = ?
             WHERE id = ?",
        )
        .bind(error)
        .bind(now)
        .bind(job_id)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn run_attempts_fail_in_flight(&mut self, run_id: &str, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE attempts SET outcome = 'failed', finished_at = ?1, error = ?2
             WHERE outcome = 'running'
               AND job_id IN (SELECT id FROM jobs WHERE run_id = ?3 AND state = 'running')",
        )
        .bind(now)
        .bind(RUN_FAILED_IN_FLIGHT)
        .bind(run_id)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn run_jobs_cancel(&mut self, run_id: &str, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE jobs SET state = 'cancelled', lease_owner = NULL, lease_expires_at = NULL,
                    last_error = 'run failed', updated_at = ?
             WHERE run_id = ? AND state IN ('blocked', 'ready', 'running')",
        )
        .bind(now)
        .bind(run_id)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn run_fail(&mut self, run_id: &str, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE counters SET value = value + 1
             WHERE name = 'seq' AND EXISTS (SELECT 1 FROM runs WHERE id = ?2 AND state = 'running');
             UPDATE runs SET state = 'failed', finished_at = ?1,
                    failed_seq = (SELECT value FROM counters WHERE name = 'seq')
             WHERE id = ?2 AND state = 'running'",
        )
        .bind(now)
        .bind(run_id)
        .execute(&mut **self.0)
        .await?;
        runs::lifecycle_events(self.0, &to_json(&[run_id]), now).await
    }

    async fn attempt_failed(&mut self, f: &JobFail) -> Result<()> {
        sqlx::query(
            "UPDATE attempts SET outcome = 'failed', finished_at = ?, error = ?, input_digests = ?
             WHERE job_id = ? AND attempt = ?",
        )
        .bind(f.now)
        .bind(&f.error)
        .bind(to_json(&f.input_digests))
        .bind(f.job_id)
        .bind(f.attempt)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn lapsed_leases(&mut self, now: i64, limit: usize) -> Result<Vec<LapsedLease>> {
        let rows = sqlx::query(concat!(
            "SELECT id, run_id, attempt FROM jobs WHERE state = 'running' AND ",
            live!(),
            " AND lease_expires_at <= ?1 AND attempt >= max_attempts ORDER BY id LIMIT ?2"
        ))
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&mut **self.0)
        .await?;
        rows.iter().map(rows::lapsed_lease).collect()
    }

    async fn attempt_lease_expired(
        &mut self,
        l: &LapsedLease,
        error: &str,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE attempts SET outcome = 'lease_expired', finished_at = ?, error = ?
             WHERE job_id = ? AND attempt = ? AND outcome = 'running'",
        )
        .bind(now)
        .bind(error)
        .bind(l.job_id)
        .bind(l.attempt)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }
}
