//! The store as each part of Ratchet sees it: one trait per role, so a part
//! depends on the few methods it uses and can be tested with a stand-in.
//!
//! | role        | used by                                                |
//! |-------------|--------------------------------------------------------|
//! | [`Catalog`] | the registry, the plugin host's loader, `plugin` CLI   |
//! | [`Intake`]  | the registry: submitting runs, hot swap                |
//! | [`Queue`]   | the scheduler and the worker                           |
//! | [`Journal`] | the host capabilities (`model`)                        |
//! | [`History`] | the read side: status, inspect, audit, tests           |
//! | [`Deliveries`] | the relay, `outbox` CLI                             |
//!
//! [`Store`] is all six, what [`super::open`] returns; the raw limit the
//! bench measures is [`RawLimit`], outside it. Methods are Noun+Verb; each
//! takes `now` from the caller's clock, never from the database's.

use std::sync::Arc;

use async_trait::async_trait;

use super::types::*;
use super::{Listening, Result, RunEnded};

/// Every role at once: the durable state of Ratchet.
pub trait Store: Catalog + Intake + Queue + Journal + History + Deliveries + 'static {}

/// Registered components, immutable per `(name, version)`.
#[async_trait]
pub trait Catalog: Send + Sync {
    /// Registers a component; the same bytes twice is a no-op, other bytes
    /// under an existing `(name, version)` is
    /// [`super::StoreError::VersionConflict`].
    async fn plugin_put(&self, p: PluginPut) -> Result<PluginPutOutcome>;
    async fn plugin_get(&self, digest: &str) -> Result<Option<PluginRecord>>;
    async fn plugin_list(&self) -> Result<Vec<PluginSummary>>;
    /// Marks `name@version` yanked: new runs no longer resolve it, runs
    /// already pinned to it keep it. Returns whether such a version exists.
    async fn plugin_yank(&self, name: &str, version: &str) -> Result<bool>;
    /// How many runs pin this digest in at least one stage.
    async fn plugin_usage(&self, digest: &str) -> Result<i64>;
    /// Every registered version of the plugins named.
    async fn plugin_versions_of(&self, names: &[String]) -> Result<Vec<PluginVersion>>;
    /// Up to `limit` non-yanked versions of `name` in `range`, highest
    /// [`version_key`] first, skipping `offset`: an index range, however
    /// many versions are registered.
    async fn plugin_candidates(
        &self,
        name: &str,
        range: &VersionKeyRange,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<PluginVersion>>;
    /// `(digest, manifest text)` of each of these digests that is registered.
    async fn plugin_manifests(&self, digests: &[String]) -> Result<Vec<(String, String)>>;
}

/// What enters a run from outside a stage: the run itself, repins, and an
/// operator's cancel or retry.
#[async_trait]
pub trait Intake: Send + Sync {
    /// Creates the run, every job, edge and input binding in one transaction;
    /// an idempotency key already used returns the existing run.
    async fn run_submit(&self, r: RunSubmit) -> Result<RunSubmitOutcome>;
    /// Pins a waiting (`blocked` or `ready`) job of a running run to another
    /// plugin digest and records it in the run's history, in one transaction.
    async fn job_repin(&self, r: JobRepin) -> Result<RepinOutcome>;
    /// Cancels a running run in one transaction: its running attempts
    /// ended `cancelled` (fenced out: their completions write nothing), its
    /// unfinished jobs `cancelled`, the run `cancelled` with its
    /// `run.cancelled` event, the cancel in its history. A run that
    /// finished is left alone.
    async fn run_cancel(&self, c: RunCancel) -> Result<CancelOutcome>;
    /// Resumes a failed or cancelled run in one transaction: each dead or
    /// cancelled job gets a new budget of attempts (its limit raised past
    /// the attempts it made) and waits for its unsatisfied edges again;
    /// succeeded jobs and their artifacts stay as they are; the run is
    /// `running` in its next generation; the retry is in its history.
    async fn run_retry(&self, r: RunRetry) -> Result<RetryOutcome>;
    /// Decides an awaiting approval gate in one transaction: the decision
    /// stored canonical-first as the gate's `decision` artifact and its
    /// attempt recorded; approved, the gate succeeds and releases the
    /// stages after it; rejected, it dies and fails its run. A gate decided
    /// already answers with the decision that won, and nothing is written.
    async fn gate_decide(&self, d: GateDecide) -> Result<GateOutcome>;
}

/// The job queue the scheduler drives and the worker keeps in repair.
#[async_trait]
pub trait Queue: Send + Sync {
    /// In one transaction: commits every completion of the batch whose
    /// attempt still holds its lease (outputs canonical-first, the job's
    /// success, its released dependents, its outbox rows and its attempt
    /// row), then claims up to `claim.limit` runnable jobs (running with an
    /// expired lease and attempts left, then ready and due, the dependents
    /// just released included). Each completion is fenced on its own; one
    /// fenced out changes nothing and comes back
    /// [`CompleteOutcome::LeaseLost`]. Each claim gets a new attempt number,
    /// its fencing token. An error rolls the whole batch back.
    async fn job_batch(&self, b: &JobBatch) -> Result<JobBatchOutcome>;
    /// [`Queue::job_batch`] with a claim only.
    async fn job_claim(&self, c: JobClaim) -> Result<Vec<ClaimedJob>> {
        let batch = JobBatch {
            completions: Vec::new(),
            claim: Some(c),
        };
        Ok(self.job_batch(&batch).await?.claimed)
    }
    /// [`Queue::job_batch`] with completions only; outcomes in batch order.
    async fn job_complete_many(&self, batch: &[JobComplete]) -> Result<Vec<CompleteOutcome>> {
        let batch = JobBatch {
            completions: batch.to_vec(),
            claim: None,
        };
        Ok(self.job_batch(&batch).await?.completed)
    }
    /// [`Queue::job_complete_many`] with a batch of one.
    async fn job_complete(&self, c: JobComplete) -> Result<CompleteOutcome> {
        let mut outcomes = self.job_complete_many(std::slice::from_ref(&c)).await?;
        // One outcome per batch entry, always.
        Ok(outcomes.swap_remove(0))
    }
    /// Records a failed attempt: retry at `retry_at`, or dead when not
    /// retryable or out of attempts (the run fails, pending jobs cancelled).
    async fn job_fail(&self, f: JobFail) -> Result<FailOutcome>;
    /// Moves the lease of each attempt `worker` still holds (running, the
    /// same attempt number, its lease not already later) to
    /// `lease_expires_at`, in one transaction; an attempt taken over or
    /// finished is left alone. Returns how many leases moved.
    async fn job_leases_renew(&self, r: LeaseRenewal) -> Result<u64>;
    /// The canonical inputs of a stage: each bound input joined with the
    /// stored artifact it names.
    async fn job_inputs_load(&self, run_id: &str, stage: &str) -> Result<Vec<LoadedInput>>;
    /// The canonical-first step of a completion on its own: insert unless
    /// present, and return the stored winner either way.
    async fn artifact_put_canonical(&self, a: ArtifactPut<'_>) -> Result<CanonicalArtifact>;
    /// One attempt's row.
    async fn attempt_get(&self, job_id: i64, attempt: i64) -> Result<Option<AttemptRow>>;
    /// The jobs running under `worker`'s leases, their inputs not loaded:
    /// after a commit whose acknowledgement was lost, the ones it claimed
    /// are among them.
    async fn jobs_leased_to(&self, worker: &str) -> Result<Vec<ClaimedJob>>;
    /// Counts of ready and running jobs over all runs, and the earliest
    /// future time at which something becomes claimable.
    async fn job_summary(&self, now: i64) -> Result<JobSummary>;
    /// Repairs continuations that slipped: exhausted expired leases become
    /// dead, out-of-step pending counts are recomputed from edges, finished
    /// runs get their final state.
    async fn reconcile(&self, now: i64) -> Result<ReconcileReport>;
    /// Clears the job queue's dead row versions out of its indexes once
    /// enough have piled up, where the database keeps them (PostgreSQL,
    /// ADR 0019). Workers call it every second.
    async fn jobs_vacuum(&self) -> Result<JobsVacuum> {
        Ok(JobsVacuum::NotDue)
    }
    /// How many write transactions make progress at once: a worker runs
    /// that many group commits in parallel. SQLite has one writer.
    fn write_concurrency(&self) -> usize {
        1
    }
    /// Calls `wake.notify_waiters()` whenever another process makes a job
    /// ready, for backends that can tell (Postgres `LISTEN`), until the
    /// returned guard is dropped; workers still poll slowly as a safety net.
    fn listen_ready(&self, wake: Arc<tokio::sync::Notify>) -> Listening {
        let _ = wake;
        Listening::default()
    }
    /// Calls `on(Some(run))` whenever a transaction may have ended `run`
    /// (succeeded, failed or cancelled), and `on(None)` when listening
    /// starts or restarts (anything may have ended unseen before), for
    /// backends that can tell other processes' changes (Postgres `LISTEN`),
    /// until the returned guard is dropped. A hint to read the run again:
    /// some calls name a run that has not ended.
    fn listen_ended(&self, on: RunEnded) -> Listening {
        let _ = on;
        Listening::default()
    }
}

/// What a host capability journals during an attempt, canonical-first and
/// outside the attempt's completion.
#[async_trait]
pub trait Journal: Send + Sync {
    /// Journals a model answer canonical-first in its own transaction and
    /// returns the recorded call (the earlier one, if any).
    async fn model_call_put(&self, m: ModelCallPut) -> Result<ModelCall>;
    async fn model_call_get(
        &self,
        run_id: &str,
        stage: &str,
        index: i64,
    ) -> Result<Option<ModelCall>>;
}

/// The read side: what happened to runs, for status, inspection and audit.
#[async_trait]
pub trait History: Send + Sync {
    async fn run_get(&self, run_id: &str) -> Result<Option<RunRow>>;
    async fn run_list(&self) -> Result<Vec<RunRow>>;
    /// Up to `q.limit` runs matching `q`, newest first (run ids are
    /// UUIDv7s, ordered by time): an API's page of runs.
    async fn run_page(&self, q: &RunQuery) -> Result<Vec<RunRow>>;
    /// The queue's and the outbox's figures now, for `/metrics`. Reads the
    /// live jobs' index, and what is pending or dead of the deliveries,
    /// never every delivery ever made.
    async fn queue_gauges(&self, now: i64) -> Result<QueueGauges>;
    /// A run's recorded history (upgrades), oldest first.
    async fn run_events(&self, run_id: &str) -> Result<Vec<RunEvent>>;
    /// Up to `limit` run ids after `after` (from the first), in id order:
    /// for walking every run a page at a time.
    async fn run_ids(&self, after: Option<&str>, limit: usize) -> Result<Vec<String>>;
    async fn job_list(&self, run_id: &str) -> Result<Vec<JobRow>>;
    /// The run's edges and input bindings (two reads, not one snapshot).
    async fn run_graph(&self, run_id: &str) -> Result<RunGraph>;
    async fn artifact_get(
        &self,
        run_id: &str,
        stage: &str,
        output: &str,
    ) -> Result<Option<Artifact>>;
    async fn artifact_list(&self, run_id: &str) -> Result<Vec<ArtifactMeta>>;
    async fn model_call_list(&self, run_id: &str) -> Result<Vec<ModelCall>>;
    async fn attempt_list(&self, run_id: &str) -> Result<Vec<AttemptRow>>;
    async fn outbox_list(&self, run_id: Option<&str>) -> Result<Vec<OutboxRow>>;
    /// Everything the invariant audit reads of one run, from one snapshot,
    /// to `visitor` a page of jobs at a time (memory bounded by a page,
    /// whatever the run's size); nothing if the run does not exist.
    async fn audit_run(&self, run_id: &str, visitor: &mut dyn AuditVisitor) -> Result<()>;
}

/// What the relay drives: committed events routed to sinks, and their
/// deliveries claimed with a lease and finished under it.
#[async_trait]
pub trait Deliveries: Send + Sync {
    /// Up to `limit` committed events no relay has routed yet, oldest
    /// first.
    async fn outbox_unrouted(&self, limit: usize) -> Result<Vec<UnroutedEvent>>;
    /// Routes the next page of events not yet routed ([`Routing`]): their
    /// deliveries (those not there yet) created and the events marked
    /// routed, in one transaction; returns how many events it routed.
    async fn deliveries_route(&self, r: &Routing) -> Result<usize>;
    /// In one transaction: records attempts' results (each `true` if it
    /// was recorded, `false` if its lease was taken over and nothing of it
    /// changed), then leases up to `c.limit` due deliveries to `c.relay`,
    /// in event order, each attempt counted as it is claimed.
    async fn deliveries_finish_then_claim(
        &self,
        finished: &[DeliveryFinish],
        claim: Option<&DeliveryClaim>,
    ) -> Result<(Vec<bool>, Vec<ClaimedDelivery>)>;
    /// Deliveries in event order, then sink; a run's are found through its
    /// events.
    async fn delivery_list(&self, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>>;
    /// Deliveries (of `run`, or of every run) whose event is not in the
    /// outbox, which `delivery_list` cannot show: the audit's.
    async fn deliveries_orphaned(&self, run: Option<&str>) -> Result<Vec<OrphanDelivery>>;
    /// Deliveries (of `run`, or of every run) on which the dead letters'
    /// table and their state disagree: the audit's. Always none on SQLite,
    /// which keeps no such table.
    async fn deliveries_dead_misfiled(&self, run: Option<&str>) -> Result<Vec<MisfiledDeadLetter>>;
    /// Pending deliveries per sink, for sinks a relay's file may no longer
    /// have; sinks with none are left out. Reads what is pending, never
    /// every delivery ever made.
    async fn deliveries_pending_by_sink(&self) -> Result<Vec<(String, i64)>>;
    /// Makes dead letters pending again, due now, with a fresh count of
    /// attempts; returns how many.
    async fn deliveries_redeliver(&self, r: Redeliver, now: i64) -> Result<u64>;
    /// Makes every pending delivery claimable again, for what routed it
    /// outside the relay's own steps (a relay from before PostgreSQL's
    /// lanes, a hand on the database): on PostgreSQL, the lanes of runs
    /// with pending deliveries and none due are made or woken (ADR 0038);
    /// returns how many. SQLite claims from the deliveries themselves.
    async fn deliveries_reconcile(&self) -> Result<u64>;
    /// Events a relay routes per transaction here, unless its
    /// configuration says otherwise.
    fn route_page(&self) -> usize;
}

/// One transaction shaped like a completion (canonical artifact insert,
/// job update, outbox row) with none of Ratchet's logic: the raw limit
/// `ratchet bench` compares against. Not part of [`Store`]: only the bench
/// opens a store with it ([`super::open_measured`]).
#[async_trait]
pub trait RawLimit: Send + Sync {
    async fn raw_completion(&self, r: RawCompletion<'_>) -> Result<()>;
}

/// A store together with its raw limit, for `ratchet bench`.
pub trait MeasuredStore: Store + RawLimit {}

impl<T: Store + RawLimit> MeasuredStore for T {}
