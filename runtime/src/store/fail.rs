//! Failing jobs: an attempt that failed (retried, or dead when out of
//! attempts or not retryable), and a lease that lapsed on its job's last
//! attempt (dead). The order of the steps is decided here once; each
//! backend supplies the statements ([`FailTx`]) in its own folder.
//!
//! A dead job fails its run: the run's other jobs are cancelled (those
//! still running too, so their attempts are fenced out when they finish and
//! their leases are never taken over, docs/job-states.md), then the run row
//! is failed, last, once its jobs are locked and cancelled: a claim of them
//! that committed first took an earlier value of the shared order than the
//! run's `failed_seq` (ADR 0018).

use super::{FailOutcome, JobFail, Result};
use crate::store::reconcile::LAPSED_ON_LAST_ATTEMPT;

/// The job of an attempt that still holds its lease.
pub(crate) struct FencedJob {
    pub run_id: String,
    pub max_attempts: i64,
}

/// A running job whose lease lapsed on its last attempt.
pub(crate) struct LapsedLease {
    pub job_id: i64,
    pub run_id: String,
    pub attempt: i64,
}

/// The statements of failing, inside one open transaction.
pub(crate) trait FailTx {
    /// The job, if `(job, attempt, worker)` still holds its lease; its row
    /// locked where the backend locks rows.
    async fn fence(&mut self, job_id: i64, attempt: i64, worker: &str)
    -> Result<Option<FencedJob>>;
    /// The job ready again at `f.retry_at`, its lease released.
    async fn job_retry(&mut self, f: &JobFail) -> Result<()>;
    /// The job dead with `error`, its lease released.
    async fn job_dead(&mut self, job_id: i64, error: &str, now: i64) -> Result<()>;
    /// The running attempts of the run's running jobs failed
    /// ([`super::RUN_FAILED_IN_FLIGHT`]).
    async fn run_attempts_fail_in_flight(&mut self, run_id: &str, now: i64) -> Result<()>;
    /// The run's blocked, ready and running jobs cancelled.
    async fn run_jobs_cancel(&mut self, run_id: &str, now: i64) -> Result<()>;
    /// The run failed, if still running, with a new value of the order
    /// shared by claims and completions as its `failed_seq`.
    async fn run_fail(&mut self, run_id: &str, now: i64) -> Result<()>;
    /// The attempt's row: failed with `f.error` and its input digests.
    async fn attempt_failed(&mut self, f: &JobFail) -> Result<()>;
    /// Up to `limit` running jobs whose lease lapsed on their last attempt,
    /// lowest id first, their rows locked (skipping rows locked by others)
    /// where the backend locks rows.
    async fn lapsed_leases(&mut self, now: i64, limit: usize) -> Result<Vec<LapsedLease>>;
    /// The attempt's row, if still running: ended as `lease_expired`.
    async fn attempt_lease_expired(&mut self, l: &LapsedLease, error: &str, now: i64)
    -> Result<()>;
}

/// Records a failed attempt (see [`super::Queue::job_fail`]). The caller
/// commits; on [`FailOutcome::LeaseLost`] nothing was written.
pub(crate) async fn fail(tx: &mut impl FailTx, f: &JobFail) -> Result<FailOutcome> {
    let Some(job) = tx.fence(f.job_id, f.attempt, &f.worker).await? else {
        return Ok(FailOutcome::LeaseLost);
    };
    let outcome = if f.retryable && f.attempt < job.max_attempts {
        tx.job_retry(f).await?;
        FailOutcome::Retrying { at: f.retry_at }
    } else {
        kill_job(tx, f.job_id, &job.run_id, &f.error, f.now).await?;
        FailOutcome::Dead
    };
    tx.attempt_failed(f).await?;
    Ok(outcome)
}

/// Ends up to `limit` leases that lapsed on their job's last attempt: the
/// attempt `lease_expired`, the job dead, its run failed. Returns how many.
pub(crate) async fn end_lapsed_leases(tx: &mut impl FailTx, now: i64, limit: usize) -> Result<u64> {
    let lapsed = tx.lapsed_leases(now, limit).await?;
    for lease in &lapsed {
        tx.attempt_lease_expired(lease, LAPSED_ON_LAST_ATTEMPT, now)
            .await?;
        kill_job(tx, lease.job_id, &lease.run_id, LAPSED_ON_LAST_ATTEMPT, now).await?;
    }
    Ok(lapsed.len() as u64)
}

/// Marks the job dead and fails its run (see the module documentation).
pub(crate) async fn kill_job(
    tx: &mut impl FailTx,
    job_id: i64,
    run_id: &str,
    error: &str,
    now: i64,
) -> Result<()> {
    tx.job_dead(job_id, error, now).await?;
    tx.run_attempts_fail_in_flight(run_id, now).await?;
    tx.run_jobs_cancel(run_id, now).await?;
    tx.run_fail(run_id, now).await
}
