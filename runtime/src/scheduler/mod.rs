//! One attempt, start to finish: claim → canonical inputs → plugin →
//! complete (or fail) in one transaction. The worker loop drives it; tests
//! drive it step by step in any order they like. Completions go through
//! one group committer per scheduler (`group_commit`).

mod config;
mod executor;
mod group_commit;
mod outcome;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::crash;
use crate::lock;
use crate::plugin::{ExecError, ExecReport, Invocation, Payload};
use crate::store::{
    CanonicalOutput, ClaimedJob, CompleteOutcome, FailOutcome, JobClaim, JobComplete, JobFail,
    LeaseRenewal, LoadedInput, Queue, StoreError, map,
};
pub use config::{Backoff, SchedulerConfig};
pub use executor::StageExecutor;
pub use group_commit::CommitStats;
use group_commit::{Claimer, GroupCommit};
use outcome::log_outcome;
pub use outcome::{AttemptOutcome, Execution, Finished};

/// How often `run_claimed` retries a transiently failed completion.
const FINISH_RETRIES: u32 = 5;

/// Told when a commit released stages and when a job started executing,
/// for `ratchet bench`'s release-latency figure.
pub trait SchedulerProbe: Send + Sync {
    fn released(&self, run_id: &str, stages: &[String]);
    fn started(&self, job: &ClaimedJob);
}

pub struct Scheduler {
    store: Arc<dyn Queue>,
    executor: Arc<dyn StageExecutor>,
    clock: Arc<dyn Clock>,
    config: SchedulerConfig,
    commits: GroupCommit,
    probe: Option<Arc<dyn SchedulerProbe>>,
    /// Attempts claimed and not finished, `(job, attempt)` to the lease
    /// their claim gave them: the leases [`Scheduler::renew_leases`] extends.
    held: Mutex<HashMap<(i64, i64), i64>>,
    /// A write failed in a way that may have committed anyway (its
    /// acknowledgement lost): the next claim first adopts the jobs leased
    /// to this worker that it does not hold.
    maybe_orphans: AtomicBool,
}

impl Scheduler {
    pub fn new(
        store: Arc<dyn Queue>,
        executor: Arc<dyn StageExecutor>,
        clock: Arc<dyn Clock>,
        config: SchedulerConfig,
    ) -> Self {
        Self::observed(store, executor, clock, config, None)
    }

    /// [`Scheduler::new`], telling `probe` (if any) when a job starts and
    /// when a commit releases stages.
    pub fn observed(
        store: Arc<dyn Queue>,
        executor: Arc<dyn StageExecutor>,
        clock: Arc<dyn Clock>,
        config: SchedulerConfig,
        probe: Option<Arc<dyn SchedulerProbe>>,
    ) -> Self {
        Self {
            commits: group_commit(&store, &clock, &config, probe.clone()),
            store,
            executor,
            clock,
            config,
            probe,
            held: Mutex::default(),
            maybe_orphans: AtomicBool::new(false),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Completions committed so far, and in how many transactions.
    pub fn commit_stats(&self) -> &Arc<CommitStats> {
        self.commits.stats()
    }

    /// Claims the oldest due job, or exactly `only_job` when given.
    pub async fn claim(&self, only_job: Option<i64>) -> Result<Option<ClaimedJob>, StoreError> {
        Ok(self.claim_jobs(1, only_job).await?.pop())
    }

    /// Claims up to `limit` due jobs in one transaction.
    pub async fn claim_many(&self, limit: usize) -> Result<Vec<ClaimedJob>, StoreError> {
        self.claim_jobs(limit, None).await
    }

    async fn claim_jobs(
        &self,
        limit: usize,
        only_job: Option<i64>,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let mut claimed = Vec::new();
        if only_job.is_none() && self.maybe_orphans.swap(false, Ordering::Relaxed) {
            claimed = self.adopt_orphans(limit).await?;
        }
        if claimed.len() < limit {
            let more = self
                .store
                .job_claim(JobClaim {
                    worker: self.config.worker_id.clone(),
                    now: self.clock.now_ms(),
                    lease_ms: self.config.lease_ms,
                    limit: limit - claimed.len(),
                    only_job,
                    caps: self.config.caps.clone(),
                })
                .await
                .inspect_err(|_| self.maybe_orphans.store(true, Ordering::Relaxed))?;
            crate::metrics::claimed(&more);
            claimed.extend(more);
        }
        if !claimed.is_empty() {
            lock(&self.held).extend(claimed.iter().map(held_entry));
            self.commits.expect(&claimed);
            crash::point("after_claim");
        }
        Ok(claimed)
    }

    /// Up to `limit` jobs leased to this worker that it does not hold: the
    /// ones a commit claimed whose acknowledgement was lost. Left to lapse,
    /// each would lose an attempt (on its last, its run would fail).
    async fn adopt_orphans(&self, limit: usize) -> Result<Vec<ClaimedJob>, StoreError> {
        let leased = self
            .store
            .jobs_leased_to(&self.config.worker_id)
            .await
            .inspect_err(|_| self.maybe_orphans.store(true, Ordering::Relaxed))?;
        let held = lock(&self.held);
        let mut orphans: Vec<ClaimedJob> = leased
            .into_iter()
            .filter(|job| !held.contains_key(&(job.job_id, job.attempt)))
            .collect();
        drop(held);
        if orphans.len() > limit {
            orphans.truncate(limit);
            self.maybe_orphans.store(true, Ordering::Relaxed);
        }
        for job in &orphans {
            tracing::info!(run = %job.run_id, stage = %job.stage, attempt = job.attempt, "adopted a job claimed by a commit whose acknowledgement was lost");
        }
        Ok(orphans)
    }

    /// `done` is finished (or abandoned), and `next` claimed in its place.
    fn hand_over(&self, done: &ClaimedJob, next: Option<&ClaimedJob>) {
        let mut held = lock(&self.held);
        held.remove(&(done.job_id, done.attempt));
        held.extend(next.map(held_entry));
    }

    /// Extends the lease of every attempt this scheduler claimed and has not
    /// finished to `lease_ms` from now, so that a stage running longer than
    /// a lease is not taken over while its worker lives; a worker calls it
    /// every third of a lease. An attempt is renewed for at most the longest
    /// one the operator's policy admits (its `timeout_ms` cap): past that,
    /// its worker is wedged, and the lease lapses. Returns how many leases
    /// moved.
    pub async fn renew_leases(&self) -> Result<u64, StoreError> {
        let now = self.clock.now_ms();
        let longest = i64::try_from(self.executor.longest_attempt_ms()).unwrap_or(i64::MAX);
        let lease_ms = self.config.lease_ms;
        let mut attempts: Vec<(i64, i64)> = lock(&self.held)
            .iter()
            .filter(|(_, first_lease)| now < (*first_lease - lease_ms).saturating_add(longest))
            .map(|(key, _)| *key)
            .collect();
        // In job id order, the order every write locks job rows in.
        attempts.sort_unstable();
        if attempts.is_empty() {
            return Ok(0);
        }
        self.store
            .job_leases_renew(LeaseRenewal {
                worker: self.config.worker_id.clone(),
                attempts,
                lease_expires_at: now + lease_ms,
            })
            .await
    }

    /// Runs the pinned plugin on inputs read from the artifacts table, and
    /// nothing else: a plugin never sees a value that is not canonical.
    pub async fn execute(&self, job: &ClaimedJob) -> Result<Execution, StoreError> {
        self.execute_on(job, job.inputs.clone()).await
    }

    /// [`Scheduler::execute`] on the inputs the claim read, if it did.
    async fn execute_on(
        &self,
        job: &ClaimedJob,
        claimed_inputs: Option<Vec<LoadedInput>>,
    ) -> Result<Execution, StoreError> {
        if let Some(probe) = &self.probe {
            probe.started(job);
        }
        let mut input_digests = BTreeMap::new();
        let loaded = match claimed_inputs {
            Some(inputs) => inputs,
            None => self.store.job_inputs_load(&job.run_id, &job.stage).await?,
        };
        let mut inputs = Vec::with_capacity(loaded.len());
        for input in loaded {
            let Some(artifact) = input.artifact else {
                let error = ExecError::Retryable(format!(
                    "input `{}` ({}.{}) has no stored artifact",
                    input.input, input.from_stage, input.from_output
                ));
                return Ok(Execution {
                    input_digests,
                    result: Err(error),
                    report: ExecReport::default(),
                });
            };
            let payload = Payload::new(input.input, artifact.meta.media_type, artifact.bytes);
            input_digests.insert(payload.name.clone(), payload.digest.clone());
            inputs.push(payload);
        }
        let invocation = Invocation {
            run_id: job.run_id.clone(),
            stage: job.stage.clone(),
            attempt: job.attempt,
            idempotency_key: format!("{}/{}", job.run_id, job.stage),
            started_at_ms: self.first_started(job).await?,
        };
        let (result, report) = self
            .executor
            .run(&job.plugin_digest, &invocation, inputs)
            .await?;
        let result = result.and_then(|outputs| lists_checked(job, outputs));
        crash::point("after_execute");
        Ok(Execution {
            input_digests,
            result,
            report,
        })
    }

    /// When the job's first attempt was claimed: this claim's time for a
    /// first attempt (no read), the first attempt's row for a retry.
    async fn first_started(&self, job: &ClaimedJob) -> Result<i64, StoreError> {
        if job.attempt <= 1 {
            return Ok(job.claimed_at);
        }
        let first = self.store.attempt_get(job.job_id, 1).await?;
        Ok(first.map_or(job.claimed_at, |a| a.claimed_at))
    }

    /// Commits the attempt's result: a completion (canonical-first, through
    /// the group committer) or a failure.
    pub async fn finish(
        &self,
        job: &ClaimedJob,
        execution: &Execution,
    ) -> Result<AttemptOutcome, StoreError> {
        Ok(self.finish_then_claim(job, execution, false).await?.0)
    }

    /// [`Scheduler::finish`], and with `claim_next`, a job claimed for this
    /// slot in the completion's own transaction (never after a failure).
    pub async fn finish_then_claim(
        &self,
        job: &ClaimedJob,
        execution: &Execution,
        claim_next: bool,
    ) -> Result<(AttemptOutcome, Option<ClaimedJob>), StoreError> {
        let now = self.clock.now_ms();
        let mut next = None;
        let outcome = match &execution.result {
            Ok(outputs) => {
                let complete = JobComplete {
                    job_id: job.job_id,
                    attempt: job.attempt,
                    worker: self.config.worker_id.clone(),
                    job: job.into(),
                    outputs: outputs.clone(),
                    input_digests: execution.input_digests.clone(),
                    now,
                };
                let (completed, claimed) = self.commits.complete(complete, claim_next).await?;
                self.hand_over(job, claimed.as_ref());
                next = claimed;
                match completed {
                    CompleteOutcome::Completed { outputs, released } => {
                        crash::point("after_commit");
                        if next.is_some() {
                            crash::point("after_claim");
                        }
                        AttemptOutcome::Succeeded { outputs, released }
                    }
                    CompleteOutcome::LeaseLost => self.own_lost_ack(job).await?,
                }
            }
            Err(error) => {
                let retry_at = now + self.config.backoff.delay_ms(job.attempt);
                // The plugin's (or a model server's) words: stored escaped
                // and bounded, whatever bytes they hold.
                let text = crate::text::bounded(&error.to_string(), crate::text::MAX_ERROR_BYTES);
                let fail = JobFail {
                    job_id: job.job_id,
                    attempt: job.attempt,
                    worker: self.config.worker_id.clone(),
                    error: text.clone(),
                    retryable: error.is_retryable(),
                    retry_at,
                    input_digests: execution.input_digests.clone(),
                    now,
                };
                let failed = self.store.job_fail(fail).await?;
                self.hand_over(job, None);
                match failed {
                    FailOutcome::Retrying { at } => AttemptOutcome::Retrying { at, error: text },
                    FailOutcome::Dead => AttemptOutcome::Dead { error: text },
                    FailOutcome::LeaseLost => AttemptOutcome::LeaseLost,
                }
            }
        };
        Ok((outcome, next))
    }

    /// A completion fenced out may be this attempt's own, committed by a
    /// try whose acknowledgement was lost: then the attempt's row records
    /// its success, by this worker, and it succeeded.
    async fn own_lost_ack(&self, job: &ClaimedJob) -> Result<AttemptOutcome, StoreError> {
        let row = self.store.attempt_get(job.job_id, job.attempt).await?;
        let Some(row) =
            row.filter(|r| r.outcome == "succeeded" && r.worker == self.config.worker_id)
        else {
            return Ok(AttemptOutcome::LeaseLost);
        };
        tracing::info!(run = %job.run_id, stage = %job.stage, attempt = job.attempt, "the attempt's completion had committed; its acknowledgement was lost");
        let proposals = row.proposal_digests.unwrap_or_default();
        let outputs = row
            .canonical_digests
            .unwrap_or_default()
            .into_iter()
            .map(|(name, digest)| {
                let proposed_digest = proposals.get(&name).cloned().unwrap_or_default();
                CanonicalOutput {
                    won: proposed_digest == digest,
                    name,
                    digest,
                    proposed_digest,
                }
            })
            .collect();
        // Who it released is not recorded; they are ready and claimable.
        Ok(AttemptOutcome::Succeeded {
            outputs,
            released: Vec::new(),
        })
    }

    /// Execute and finish a job already claimed. A transient store error
    /// while finishing (a dropped connection, a deadlock victim) is retried
    /// a few times: the attempt still holds its lease, and the transaction
    /// either committed whole or not at all.
    pub async fn run_claimed(&self, job: ClaimedJob) -> Result<Finished, StoreError> {
        Ok(self.run_claimed_then_claim(job, false).await?.0)
    }

    /// [`Scheduler::run_claimed`], and with `claim_next`, the job claimed
    /// for this slot in the completion's transaction, if any was due.
    pub async fn run_claimed_then_claim(
        &self,
        mut job: ClaimedJob,
        claim_next: bool,
    ) -> Result<(Finished, Option<ClaimedJob>), StoreError> {
        let claimed_inputs = job.inputs.take();
        let started = std::time::Instant::now();
        let mut execution = match self.execute_on(&job, claimed_inputs).await {
            Ok(execution) => execution,
            Err(e) => {
                // Abandoned: the lease lapses and the attempt is retried.
                self.hand_over(&job, None);
                return Err(e);
            }
        };
        let mut tries = 0u32;
        let (outcome, next) = loop {
            match self.finish_then_claim(&job, &execution, claim_next).await {
                Err(e) if e.is_transient() && tries < FINISH_RETRIES => {
                    tries += 1;
                    // It may have committed, claims included.
                    self.maybe_orphans.store(true, Ordering::Relaxed);
                    tracing::warn!(run = %job.run_id, stage = %job.stage, "finishing the attempt failed, retrying: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50 << tries)).await;
                }
                Err(e) if e.is_refusal() && execution.result.is_ok() => {
                    // The database refused this attempt's result (a value
                    // it cannot store, a constraint): this attempt fails
                    // with the reason, and the worker carries on.
                    tracing::warn!(run = %job.run_id, stage = %job.stage, "the store refused a completion: {e}");
                    execution.result = Err(ExecError::Refused(e.to_string()));
                }
                Err(e) => {
                    // Given up: as above.
                    tracing::error!(run = %job.run_id, stage = %job.stage, attempt = job.attempt, "attempt abandoned, its lease will lapse: {e}");
                    self.hand_over(&job, None);
                    return Err(e);
                }
                Ok(finished) => break finished,
            }
        };
        log_outcome(&job, &outcome);
        let report = &execution.report;
        crate::metrics::attempt(&report.plugin, &outcome, started.elapsed(), report);
        if execution.report.log_lines_dropped > 0 {
            tracing::warn!(
                run = %job.run_id,
                stage = %job.stage,
                attempt = job.attempt,
                dropped = execution.report.log_lines_dropped,
                "log lines dropped: the attempt is not granted the `log` capability"
            );
        }
        let finished = Finished {
            job,
            outcome,
            report: execution.report,
        };
        Ok((finished, next))
    }
}

fn group_commit(
    store: &Arc<dyn Queue>,
    clock: &Arc<dyn Clock>,
    config: &SchedulerConfig,
    probe: Option<Arc<dyn SchedulerProbe>>,
) -> GroupCommit {
    let claimer = Claimer {
        worker: config.worker_id.clone(),
        lease_ms: config.lease_ms,
        clock: clock.clone(),
        probe,
        caps: config.caps.clone(),
    };
    let parallel = store.write_concurrency();
    GroupCommit::new(
        store.clone(),
        config.commit_batch,
        parallel,
        config.commit_linger,
        claimer,
    )
}

/// What [`Scheduler::renew_leases`] keeps of a claimed job.
fn held_entry(job: &ClaimedJob) -> ((i64, i64), i64) {
    ((job.job_id, job.attempt), job.lease_expires_at)
}

/// The attempt's outputs, unless one that a later stage maps over cannot
/// be mapped (docs/map.md): the attempt then fails, fatally, before
/// anything of it is committed, and a retry of the stage may propose
/// another list.
fn lists_checked(job: &ClaimedJob, outputs: Vec<Payload>) -> Result<Vec<Payload>, ExecError> {
    for (name, cap) in &job.lists {
        let list = outputs.iter().find(|o| &o.name == name);
        if let Some(Err(what)) = list.map(|l| map::list_elements(&l.bytes, *cap)) {
            return Err(ExecError::Contract(format!(
                "output `{name}` is mapped over by a later stage, so it must be a JSON array of at most {cap} elements, but it is {what}"
            )));
        }
    }
    Ok(outputs)
}
