//! Durable state behind one [`Store`] trait; each backend owns its SQL
//! (`sqlite/`). Every multi-row change is one transaction.

mod complete;
mod postgres;
mod reconcile;
mod rows;
mod sqlite;
mod types;

use std::sync::Arc;

use async_trait::async_trait;

pub use postgres::PostgresStore;
pub use reconcile::{RECONCILE_LEASES_PER_BATCH, RECONCILE_RUNS_PER_BATCH};
pub use sqlite::{CheckpointStats, SqliteStore};
pub use types::*;

/// Errors a store operation can end with. Expected non-failures (a fenced-out
/// completion, an existing run) are outcome enums, not errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("cannot apply the database migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(
        "unsupported database url `{0}` (use sqlite://PATH, e.g. sqlite://ratchet.db, or postgres://USER@HOST/DB)"
    )]
    UnsupportedUrl(String),
    #[error(
        "plugin `{name}@{version}` is already registered with digest {existing}; versions are immutable (bump the version in the plugin's manifest)"
    )]
    VersionConflict {
        name: String,
        version: String,
        existing: String,
    },
    #[error("corrupt row in `{table}`: {detail}")]
    Corrupt { table: &'static str, detail: String },
    #[error(
        "the worker's group committer stopped (a bug: it panicked); the attempt was not recorded and is retried once its lease expires"
    )]
    CommitterStopped,
}

impl StoreError {
    /// What a store returns at the `commit_ack_lost` fault point.
    pub(crate) fn ack_lost() -> Self {
        StoreError::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "the connection closed before the commit was acknowledged (fault point commit_ack_lost)",
        )))
    }

    /// Whether the database refused this operation for what it was asked
    /// to write (a constraint, a value it cannot store): the same request
    /// fails the same way, but other operations are unaffected.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            StoreError::Database(sqlx::Error::Database(_) | sqlx::Error::Encode(_))
        ) && !self.is_transient()
    }

    /// Whether retrying the same operation may succeed (lock contention,
    /// a dropped connection) rather than fail the same way again.
    pub fn is_transient(&self) -> bool {
        let StoreError::Database(e) = self else {
            return false;
        };
        match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default();
                // Postgres: serialization failure, deadlock, shutdown, lost
                // connection; SQLite: busy or locked.
                matches!(
                    code.as_ref(),
                    "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "5" | "6"
                ) || code.starts_with("08")
            }
            _ => false,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Implements `Store` for a backend: each method forwards to the function
/// of the same concern in the backend's own modules
/// (`plugins`, `runs`, `jobs`, `complete`, `artifacts`, `audit`, `bench`),
/// which own the SQL;
/// extra trait items (like `listen_ready`) are added as given.
macro_rules! impl_store {
    ($store:ty { $($extra:item)* }) => {
        #[async_trait::async_trait]
        impl Store for $store {
            async fn plugin_put(&self, p: PluginPut) -> Result<PluginPutOutcome> {
                plugins::put(self, p).await
            }
            async fn plugin_get(&self, digest: &str) -> Result<Option<PluginRecord>> {
                plugins::get(self, digest).await
            }
            async fn plugin_list(&self) -> Result<Vec<PluginSummary>> {
                plugins::list(self).await
            }
            async fn plugin_yank(&self, name: &str, version: &str) -> Result<bool> {
                plugins::yank(self, name, version).await
            }
            async fn plugin_usage(&self, digest: &str) -> Result<i64> {
                plugins::usage(self, digest).await
            }
            async fn plugin_candidates(&self, name: &str, range: &VersionKeyRange, offset: i64, limit: i64) -> Result<Vec<PluginVersion>> {
                plugins::candidates(self, name, range, offset, limit).await
            }
            async fn plugin_versions_of(&self, names: &[String]) -> Result<Vec<PluginVersion>> {
                plugins::versions_of(self, names).await
            }
            async fn plugin_manifests(&self, digests: &[String]) -> Result<Vec<(String, String)>> {
                plugins::manifests(self, digests).await
            }
            async fn run_submit(&self, r: RunSubmit) -> Result<RunSubmitOutcome> {
                runs::submit(self, r).await
            }
            async fn run_get(&self, run_id: &str) -> Result<Option<RunRow>> {
                runs::get(self, run_id).await
            }
            async fn run_list(&self) -> Result<Vec<RunRow>> {
                runs::list(self).await
            }
            async fn run_events(&self, run_id: &str) -> Result<Vec<RunEvent>> {
                runs::events(self, run_id).await
            }
            async fn job_repin(&self, r: JobRepin) -> Result<RepinOutcome> {
                runs::repin(self, r).await
            }
            async fn job_batch(&self, b: &JobBatch) -> Result<JobBatchOutcome> {
                complete::batch(self, b).await
            }
            async fn job_fail(&self, f: JobFail) -> Result<FailOutcome> {
                jobs::fail(self, f).await
            }
            async fn job_leases_renew(&self, r: LeaseRenewal) -> Result<u64> {
                jobs::renew(self, r).await
            }
            async fn job_list(&self, run_id: &str) -> Result<Vec<JobRow>> {
                jobs::list(&self.pool, Some(run_id)).await
            }
            async fn job_summary(&self, now: i64) -> Result<JobSummary> {
                jobs::summary(self, now).await
            }
            async fn job_inputs_load(&self, run_id: &str, stage: &str) -> Result<Vec<LoadedInput>> {
                artifacts::inputs_load(self, run_id, stage).await
            }
            async fn artifact_put_canonical(&self, a: ArtifactPut) -> Result<CanonicalArtifact> {
                artifacts::put_canonical(self, a).await
            }
            async fn artifact_get(&self, run_id: &str, stage: &str, output: &str) -> Result<Option<Artifact>> {
                artifacts::get(&self.pool, run_id, stage, output).await
            }
            async fn artifact_list(&self, run_id: &str) -> Result<Vec<ArtifactMeta>> {
                artifacts::list(&self.pool, Some(run_id)).await
            }
            async fn model_call_put(&self, m: ModelCallPut) -> Result<ModelCall> {
                artifacts::model_call_put(self, m).await
            }
            async fn model_call_get(&self, run_id: &str, stage: &str, index: i64) -> Result<Option<ModelCall>> {
                artifacts::model_call_get(&self.pool, run_id, stage, index).await
            }
            async fn model_call_list(&self, run_id: &str) -> Result<Vec<ModelCall>> {
                artifacts::model_call_list(&self.pool, run_id).await
            }
            async fn attempt_list(&self, run_id: &str) -> Result<Vec<AttemptRow>> {
                audit::attempts(&self.pool, Some(run_id)).await
            }
            async fn attempt_get(&self, job_id: i64, attempt: i64) -> Result<Option<AttemptRow>> {
                audit::attempt(&self.pool, job_id, attempt).await
            }
            async fn jobs_leased_to(&self, worker: &str) -> Result<Vec<ClaimedJob>> {
                jobs::leased_to(&self.pool, worker).await
            }
            async fn outbox_list(&self, run_id: Option<&str>) -> Result<Vec<OutboxRow>> {
                audit::outbox(&self.pool, run_id).await
            }
            async fn reconcile(&self, now: i64) -> Result<ReconcileReport> {
                crate::store::reconcile::in_batches(self, now).await
            }
            async fn audit_run(&self, run_id: &str, visitor: &mut dyn AuditVisitor) -> Result<()> {
                audit::run(self, run_id, visitor).await
            }
            async fn run_ids(&self, after: Option<&str>, limit: usize) -> Result<Vec<String>> {
                audit::run_ids(self, after, limit).await
            }
            async fn bench_raw_completion(&self, r: RawCompletion) -> Result<()> {
                bench::raw_completion(self, r).await
            }
            $($extra)*
        }
    };
}
pub(crate) use impl_store;

/// Opens the store a URL names and applies pending migrations.
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::open(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_string()))
    }
}

/// The durable state of Ratchet. Methods are Noun+Verb; each takes `now`
/// from the caller's clock, never from the database's.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Registers a component; the same bytes twice is a no-op, other bytes
    /// under an existing `(name, version)` is [`StoreError::VersionConflict`].
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

    /// Creates the run, every job, edge and input binding in one transaction;
    /// an idempotency key already used returns the existing run.
    async fn run_submit(&self, r: RunSubmit) -> Result<RunSubmitOutcome>;
    async fn run_get(&self, run_id: &str) -> Result<Option<RunRow>>;
    async fn run_list(&self) -> Result<Vec<RunRow>>;
    /// A run's recorded history (upgrades), oldest first.
    async fn run_events(&self, run_id: &str) -> Result<Vec<RunEvent>>;

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
    /// [`Store::job_batch`] with a claim only.
    async fn job_claim(&self, c: JobClaim) -> Result<Vec<ClaimedJob>> {
        let batch = JobBatch {
            completions: Vec::new(),
            claim: Some(c),
        };
        Ok(self.job_batch(&batch).await?.claimed)
    }
    /// [`Store::job_batch`] with completions only; outcomes in batch order.
    async fn job_complete_many(&self, batch: &[JobComplete]) -> Result<Vec<CompleteOutcome>> {
        let batch = JobBatch {
            completions: batch.to_vec(),
            claim: None,
        };
        Ok(self.job_batch(&batch).await?.completed)
    }
    /// [`Store::job_complete_many`] with a batch of one.
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
    async fn job_list(&self, run_id: &str) -> Result<Vec<JobRow>>;
    /// Pins a waiting (`blocked` or `ready`) job of a running run to another
    /// plugin digest and records it in the run's history, in one transaction.
    async fn job_repin(&self, r: JobRepin) -> Result<RepinOutcome>;
    /// Counts of ready and running jobs over all runs, and the earliest
    /// future time at which something becomes claimable.
    async fn job_summary(&self, now: i64) -> Result<JobSummary>;

    /// The canonical inputs of a stage: each bound input joined with the
    /// stored artifact it names.
    async fn job_inputs_load(&self, run_id: &str, stage: &str) -> Result<Vec<LoadedInput>>;

    /// The canonical-first primitive on its own: insert unless present, and
    /// return the stored winner either way.
    async fn artifact_put_canonical(&self, a: ArtifactPut) -> Result<CanonicalArtifact>;
    async fn artifact_get(
        &self,
        run_id: &str,
        stage: &str,
        output: &str,
    ) -> Result<Option<Artifact>>;
    async fn artifact_list(&self, run_id: &str) -> Result<Vec<ArtifactMeta>>;

    /// Journals a model answer canonical-first in its own transaction and
    /// returns the recorded call (the earlier one, if any).
    async fn model_call_put(&self, m: ModelCallPut) -> Result<ModelCall>;
    async fn model_call_get(
        &self,
        run_id: &str,
        stage: &str,
        index: i64,
    ) -> Result<Option<ModelCall>>;
    async fn model_call_list(&self, run_id: &str) -> Result<Vec<ModelCall>>;

    async fn attempt_list(&self, run_id: &str) -> Result<Vec<AttemptRow>>;
    /// One attempt's row.
    async fn attempt_get(&self, job_id: i64, attempt: i64) -> Result<Option<AttemptRow>>;
    /// The jobs running under `worker`'s leases, their inputs not loaded:
    /// after a commit whose acknowledgement was lost, the ones it claimed
    /// are among them.
    async fn jobs_leased_to(&self, worker: &str) -> Result<Vec<ClaimedJob>>;
    async fn outbox_list(&self, run_id: Option<&str>) -> Result<Vec<OutboxRow>>;

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

    /// Everything the invariant audit reads of one run, from one snapshot,
    /// to `visitor` a page of jobs at a time (memory bounded by a page,
    /// whatever the run's size); nothing if the run does not exist.
    async fn audit_run(&self, run_id: &str, visitor: &mut dyn AuditVisitor) -> Result<()>;
    /// Up to `limit` run ids after `after` (from the first), in id order:
    /// for walking every run a page at a time.
    async fn run_ids(&self, after: Option<&str>, limit: usize) -> Result<Vec<String>>;

    /// One transaction shaped like a completion (canonical artifact insert,
    /// job update, outbox row) with none of Ratchet's logic: the raw limit
    /// `ratchet bench` compares against.
    async fn bench_raw_completion(&self, r: RawCompletion) -> Result<()>;

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
}

/// Listening for ready jobs ([`Store::listen_ready`]) stops when this is
/// dropped. A listener that outlived its worker kept its connection, and
/// its store's pool, open for as long as the process ran.
#[derive(Debug, Default)]
pub struct Listening(Option<tokio::task::JoinHandle<()>>);

impl Listening {
    pub(crate) fn task(task: tokio::task::JoinHandle<()>) -> Self {
        Self(Some(task))
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}
