//! Attempts the host makes itself, running no plugin: an approval gate's
//! decision (`store::gate`) and a mapped stage's join (`store::map`). Each
//! is its job's next attempt, taken and finished in the transaction that
//! decides it, so the audit checks it as any attempt: one claim sequence of
//! the shared order, the artifacts it stored, the edges it satisfied.

use super::complete::{CompletionTx, Success};
use super::fail::{self, FailTx};
use super::{ArtifactPut, CanonicalArtifact, JobFail, Result};

/// The statements of a host attempt, inside one open transaction.
pub(crate) trait HostTx {
    /// The job `running` as attempt `attempt` under `worker`'s lease, and
    /// its attempt row opened (with no plugin) with a new value of the
    /// order shared by claims and completions.
    async fn job_take(&mut self, job_id: i64, attempt: i64, worker: &str, now: i64) -> Result<()>;
    /// Stores an artifact canonical-first; the stored winner either way.
    async fn artifact_put(&mut self, put: ArtifactPut<'_>) -> Result<CanonicalArtifact>;
    /// [`succeed`] on the backend's completion statements; returns the
    /// `(run, stage)` of the jobs it released that map over a list.
    async fn job_succeed(&mut self, s: &Success<'_>, run_id: &str)
    -> Result<Vec<(String, String)>>;
    /// [`kill`] on the backend's failing statements.
    async fn job_kill(&mut self, f: &JobFail, run_id: &str) -> Result<()>;
}

/// A host attempt's success: the job succeeded, its dependents released,
/// and its run finished if that was its last job. Returns the released
/// jobs that map over a list, for `store::map` to expand.
pub(crate) async fn succeed(
    tx: &mut impl CompletionTx,
    s: &Success<'_>,
    run_id: &str,
) -> Result<Vec<(String, String)>> {
    let released = tx.record_success_and_release(s).await?;
    if released.satisfied.is_empty() {
        tx.runs_finish_if_done(&[run_id], s.now).await?;
    }
    Ok(released.mapping)
}

/// A host attempt's failure: the job dead, its run failed, the attempt's
/// row failed with the error.
pub(crate) async fn kill(tx: &mut impl FailTx, f: &JobFail, run_id: &str) -> Result<()> {
    fail::kill_job(tx, f.job_id, run_id, &f.error, f.now).await?;
    tx.attempt_failed(f).await
}

/// A failure of the host attempt `attempt` of a job, with no retry.
pub(crate) fn failure(job_id: i64, attempt: i64, worker: &str, error: String, now: i64) -> JobFail {
    JobFail {
        job_id,
        attempt,
        worker: worker.to_string(),
        error,
        retryable: false,
        retry_at: now,
        input_digests: Default::default(),
        now,
    }
}
