//! Attempts the host makes itself, running no plugin: an approval gate's
//! decision (`store::gate`) and a mapped stage's join (`store::map`). Each
//! is its job's next attempt, taken and finished in the transaction that
//! decides it, so the audit checks it as any attempt: one claim sequence of
//! the shared order, the artifacts it stored, the edges it satisfied.

use std::collections::BTreeMap;

use super::complete::{AttemptSucceeded, CompletionTx, Success};
use super::fail::{self, FailTx};
use super::{ArtifactPut, CanonicalArtifact, JobFail, Payload, Result};

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

/// One host attempt: its job, its number and who makes it.
pub(crate) struct HostAttempt<'a> {
    pub job_id: i64,
    pub attempt: i64,
    pub run_id: &'a str,
    pub stage: &'a str,
    pub worker: &'a str,
    pub now: i64,
}

impl HostAttempt<'_> {
    /// Takes the job as this attempt ([`HostTx::job_take`]).
    pub async fn take(&self, tx: &mut impl HostTx) -> Result<()> {
        tx.job_take(self.job_id, self.attempt, self.worker, self.now)
            .await
    }

    /// Stores one of the attempt's outputs canonical-first.
    pub async fn put(&self, tx: &mut impl HostTx, output: &Payload) -> Result<CanonicalArtifact> {
        tx.artifact_put(ArtifactPut {
            run_id: self.run_id,
            stage: self.stage,
            artifact: output,
            attempt: self.attempt,
            plugin_digest: None,
            now: self.now,
        })
        .await
    }

    /// Succeeds the job with its stored outputs (name -> digest), having
    /// consumed `inputs` (name -> digest). Returns the released jobs that
    /// map over a list.
    pub async fn succeed(
        &self,
        tx: &mut impl HostTx,
        outputs: &BTreeMap<String, String>,
        inputs: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>> {
        let canonical: BTreeMap<&str, &str> = outputs
            .iter()
            .map(|(name, digest)| (name.as_str(), digest.as_str()))
            .collect();
        let success = Success {
            outbox: Vec::new(),
            job_ids: vec![self.job_id],
            attempts: vec![AttemptSucceeded {
                job_id: self.job_id,
                attempt: self.attempt,
                input_digests: inputs,
                proposals: canonical.clone(),
                canonical,
                all_won: true,
                now: self.now,
            }],
            from: vec![(self.run_id, self.stage)],
            now: self.now,
        };
        tx.job_succeed(&success, self.run_id).await
    }

    /// Kills the job with `error`, having consumed `inputs`: its run fails.
    pub async fn fail(
        &self,
        tx: &mut impl HostTx,
        error: String,
        inputs: BTreeMap<String, String>,
    ) -> Result<()> {
        let failed = JobFail {
            job_id: self.job_id,
            attempt: self.attempt,
            worker: self.worker.to_string(),
            error,
            retryable: false,
            retry_at: self.now,
            input_digests: inputs,
            now: self.now,
        };
        tx.job_kill(&failed, self.run_id).await
    }
}
