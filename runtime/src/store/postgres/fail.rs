//! The statements of failing (`store::fail`): a failed attempt, a lease
//! that lapsed on its job's last attempt.

use super::*;
use crate::store::fail::{self, FailTx, FencedJob, LapsedLease};

pub(super) async fn fail(store: &PostgresStore, f: JobFail) -> Result<FailOutcome> {
    let mut tx = store.begin_write().await?;
    let outcome = fail::fail(&mut Failing(&mut tx), &f).await?;
    if outcome != FailOutcome::LeaseLost {
        tx.commit().await?;
    }
    Ok(outcome)
}

/// The statements of `store::fail` on a write transaction.
pub(super) struct Failing<'t>(pub &'t mut Tx);

impl FailTx for Failing<'_> {
    async fn fence(
        &mut self,
        job_id: i64,
        attempt: i64,
        worker: &str,
    ) -> Result<Option<FencedJob>> {
        let row = sqlx::query(
            "SELECT run_id, max_attempts FROM jobs
             WHERE id = $1 AND attempt = $2 AND lease_owner = $3 AND state = 'running'
             FOR UPDATE",
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
                    next_run_at = $1, last_error = $2, updated_at = $3
             WHERE id = $4",
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
                    last_error = $1, updated_at = $2
             WHERE id = $3",
        )
        .bind(error)
        .bind(now)
        .bind(job_id)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn run_attempts_fail_in_flight(&mut self, run_id: &str, now: i64) -> Result<()> {
        attempts_in_flight_end(self.0, run_id, "failed", RUN_FAILED_IN_FLIGHT, now).await
    }

    async fn run_jobs_cancel(&mut self, run_id: &str, now: i64) -> Result<()> {
        unfinished_jobs_cancel(self.0, run_id, "run failed", now).await
    }

    async fn run_fail(&mut self, run_id: &str, now: i64) -> Result<()> {
        run_end(self.0, run_id, "failed", now).await
    }

    async fn attempt_failed(&mut self, f: &JobFail) -> Result<()> {
        sqlx::query(
            "UPDATE attempts SET outcome = 'failed', finished_at = $1, error = $2, input_digests = $3
             WHERE job_id = $4 AND attempt = $5",
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
        let rows = sqlx::query(
            "SELECT id, run_id, attempt FROM jobs
             WHERE state = 'running' AND lease_expires_at <= $1 AND attempt >= max_attempts
             ORDER BY id LIMIT $2
             FOR UPDATE SKIP LOCKED",
        )
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
            "UPDATE attempts SET outcome = 'lease_expired', finished_at = $1, error = $2
             WHERE job_id = $3 AND attempt = $4 AND outcome = 'running'",
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

/// Ends the running attempts of the run's running jobs with `outcome` and
/// `error` (a run that failed or was cancelled while they ran).
pub(super) async fn attempts_in_flight_end(
    tx: &mut Tx,
    run_id: &str,
    outcome: &str,
    error: &str,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE attempts SET outcome = $1, finished_at = $2, error = $3
         WHERE outcome = 'running'
           AND job_id IN (SELECT id FROM jobs WHERE run_id = $4 AND state = 'running')",
    )
    .bind(outcome)
    .bind(now)
    .bind(error)
    .bind(run_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Cancels the run's blocked, ready and running jobs, leases released.
pub(super) async fn unfinished_jobs_cancel(
    tx: &mut Tx,
    run_id: &str,
    why: &str,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE jobs SET state = 'cancelled', lease_owner = NULL, lease_expires_at = NULL,
                last_error = $1, updated_at = $2
         WHERE run_id = $3 AND state IN ('blocked', 'ready', 'running', 'awaiting')",
    )
    .bind(why)
    .bind(now)
    .bind(run_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Ends the run, if still running, in `state` (`failed` or `cancelled`),
/// with a new value of the order shared by claims and completions as its
/// `failed_seq`, and writes its lifecycle event.
/// Waiting clients in other processes are told in the transaction: a run
/// fails or is cancelled rarely, unlike a batch's commit.
pub(super) async fn run_end(tx: &mut Tx, run_id: &str, state: &str, now: i64) -> Result<()> {
    let ended = sqlx::query(
        "UPDATE runs SET state = $3, finished_at = $1, failed_seq = nextval('ratchet_seq')
         WHERE id = $2 AND state = 'running'",
    )
    .bind(now)
    .bind(run_id)
    .bind(state)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if ended > 0 {
        announce(&mut **tx, false, &[run_id]).await?;
    }
    sqlx::query("SELECT ratchet_lifecycle_events($1, $2)")
        .bind(now)
        .bind([run_id])
        .execute(&mut **tx)
        .await?;
    Ok(())
}
