//! Durable state behind [`Store`], seen by each part through its role
//! (`roles.rs`); each backend owns its SQL (`sqlite/`, `postgres/`). Every
//! multi-row change is one transaction.

mod audit_run;
mod canonical;
mod caps;
mod complete;
mod control;
mod deliveries;
mod fail;
mod gate;
mod host;
pub mod map;
mod postgres;
mod reconcile;
mod registration;
mod repin;
mod roles;
mod rows;
mod sqlite;
mod submit;
mod types;

use std::sync::Arc;

pub use postgres::PostgresStore;
pub use reconcile::{RECONCILE_LEASES_PER_BATCH, RECONCILE_RUNS_PER_BATCH};
pub use roles::{
    Catalog, Deliveries, History, Intake, Journal, MeasuredStore, Queue, RawLimit, Store,
};
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

/// Implements every role of [`Store`] for a backend: each method forwards
/// to the function of the same concern in the backend's own modules
/// (`plugins`, `runs`, `control`, `jobs`, `complete`, `fail`, `artifacts`, `audit`,
/// `deliveries`, `bench`),
/// which own the SQL; extra [`Queue`] items (like `listen_ready`) are added
/// as given.
macro_rules! impl_store {
    ($store:ty { $($extra:item)* }) => {
        #[async_trait::async_trait]
        impl Catalog for $store {
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
        }

        #[async_trait::async_trait]
        impl Intake for $store {
            async fn run_submit(&self, r: RunSubmit) -> Result<RunSubmitOutcome> {
                runs::submit(self, r).await
            }
            async fn job_repin(&self, r: JobRepin) -> Result<RepinOutcome> {
                runs::repin(self, r).await
            }
            async fn run_cancel(&self, c: RunCancel) -> Result<CancelOutcome> {
                control::cancel(self, c).await
            }
            async fn run_retry(&self, r: RunRetry) -> Result<RetryOutcome> {
                control::retry(self, r).await
            }
            async fn gate_decide(&self, d: GateDecide) -> Result<GateOutcome> {
                gate::decide(self, &d).await
            }
        }

        #[async_trait::async_trait]
        impl Queue for $store {
            async fn job_batch(&self, b: &JobBatch) -> Result<JobBatchOutcome> {
                complete::batch(self, b).await
            }
            async fn job_fail(&self, f: JobFail) -> Result<FailOutcome> {
                fail::fail(self, f).await
            }
            async fn job_leases_renew(&self, r: LeaseRenewal) -> Result<u64> {
                jobs::renew(self, r).await
            }
            async fn job_inputs_load(&self, run_id: &str, stage: &str) -> Result<Vec<LoadedInput>> {
                artifacts::inputs_load(self, run_id, stage).await
            }
            async fn artifact_put_canonical(&self, a: ArtifactPut<'_>) -> Result<CanonicalArtifact> {
                artifacts::put_canonical(self, a).await
            }
            async fn attempt_get(&self, job_id: i64, attempt: i64) -> Result<Option<AttemptRow>> {
                audit::attempt(&self.pool, job_id, attempt).await
            }
            async fn jobs_leased_to(&self, worker: &str) -> Result<Vec<ClaimedJob>> {
                jobs::leased_to(&self.pool, worker).await
            }
            async fn job_summary(&self, now: i64) -> Result<JobSummary> {
                jobs::summary(self, now).await
            }
            async fn reconcile(&self, now: i64) -> Result<ReconcileReport> {
                crate::store::reconcile::in_batches(self, now).await
            }
            $($extra)*
        }

        #[async_trait::async_trait]
        impl Journal for $store {
            async fn model_call_put(&self, m: ModelCallPut) -> Result<ModelCall> {
                artifacts::model_call_put(self, m).await
            }
            async fn model_call_get(&self, run_id: &str, stage: &str, index: i64) -> Result<Option<ModelCall>> {
                artifacts::model_call_get(&self.pool, run_id, stage, index).await
            }
        }

        #[async_trait::async_trait]
        impl History for $store {
            async fn run_get(&self, run_id: &str) -> Result<Option<RunRow>> {
                runs::get(self, run_id).await
            }
            async fn run_list(&self) -> Result<Vec<RunRow>> {
                runs::list(self).await
            }
            async fn run_page(&self, q: &RunQuery) -> Result<Vec<RunRow>> {
                runs::page(self, q).await
            }
            async fn queue_gauges(&self, now: i64) -> Result<QueueGauges> {
                jobs::gauges(&self.pool, now).await
            }
            async fn run_events(&self, run_id: &str) -> Result<Vec<RunEvent>> {
                runs::events(self, run_id).await
            }
            async fn run_ids(&self, after: Option<&str>, limit: usize) -> Result<Vec<String>> {
                audit::run_ids(self, after, limit).await
            }
            async fn job_list(&self, run_id: &str) -> Result<Vec<JobRow>> {
                jobs::list(&self.pool, Some(run_id)).await
            }
            async fn run_graph(&self, run_id: &str) -> Result<RunGraph> {
                runs::graph(&self.pool, run_id).await
            }
            async fn artifact_get(&self, run_id: &str, stage: &str, output: &str) -> Result<Option<Artifact>> {
                artifacts::get(&self.pool, run_id, stage, output).await
            }
            async fn artifact_list(&self, run_id: &str) -> Result<Vec<ArtifactMeta>> {
                artifacts::list(&self.pool, Some(run_id)).await
            }
            async fn model_call_list(&self, run_id: &str) -> Result<Vec<ModelCall>> {
                artifacts::model_call_list(&self.pool, run_id).await
            }
            async fn attempt_list(&self, run_id: &str) -> Result<Vec<AttemptRow>> {
                audit::attempts(&self.pool, Some(run_id)).await
            }
            async fn outbox_list(&self, run_id: Option<&str>) -> Result<Vec<OutboxRow>> {
                audit::outbox(&self.pool, run_id).await
            }
            async fn audit_run(&self, run_id: &str, visitor: &mut dyn AuditVisitor) -> Result<()> {
                audit::run(self, run_id, visitor).await
            }
        }

        #[async_trait::async_trait]
        impl Deliveries for $store {
            async fn outbox_unrouted(&self, limit: usize) -> Result<Vec<UnroutedEvent>> {
                deliveries::unrouted(&self.pool, limit).await
            }
            async fn deliveries_route(&self, r: &Routing) -> Result<usize> {
                deliveries::route(self, r).await
            }
            async fn deliveries_finish_then_claim(
                &self,
                finished: &[DeliveryFinish],
                claim: Option<&DeliveryClaim>,
            ) -> Result<(Vec<bool>, Vec<ClaimedDelivery>)> {
                deliveries::finish_then_claim(self, finished, claim).await
            }
            async fn delivery_list(&self, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
                deliveries::list(&self.pool, f).await
            }
            async fn deliveries_orphaned(&self, run: Option<&str>) -> Result<Vec<OrphanDelivery>> {
                deliveries::orphaned(&self.pool, run).await
            }
            async fn deliveries_dead_misfiled(
                &self,
                run: Option<&str>,
            ) -> Result<Vec<MisfiledDeadLetter>> {
                deliveries::dead_misfiled(&self.pool, run).await
            }
            async fn deliveries_pending_by_sink(&self) -> Result<Vec<(String, i64)>> {
                deliveries::pending_by_sink(&self.pool).await
            }
            async fn deliveries_redeliver(&self, r: Redeliver, now: i64) -> Result<u64> {
                deliveries::redeliver(self, r, now).await
            }
            async fn deliveries_reconcile(&self) -> Result<u64> {
                deliveries::reconcile(&self.pool).await
            }
            fn route_page(&self) -> usize {
                deliveries::ROUTE_PAGE
            }
        }

        #[async_trait::async_trait]
        impl RawLimit for $store {
            async fn raw_completion(&self, r: RawCompletion<'_>) -> Result<()> {
                bench::raw_completion(self, r).await
            }
        }

        impl Store for $store {}
    };
}
pub(crate) use impl_store;

/// A connection inside a transaction its caller opened, on a database
/// Ratchet's store was opened on: what [`crate::registry::run_submit_in`]
/// writes a run into, so the run commits or rolls back with the caller's
/// own statements. On PostgreSQL, the caller's `Transaction` (deref'd to
/// its connection); on SQLite, the writer's connection that
/// [`SqliteStore::write`] lends.
pub trait CallerTransaction: Send {
    /// Writes the run's rows ([`Intake::run_submit`]); nothing is committed.
    fn run_submit(
        self,
        r: RunSubmit,
    ) -> impl std::future::Future<Output = Result<RunSubmitOutcome>> + Send;
}

/// Opens the store a URL names and applies pending migrations.
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    Ok(open_measured(url).await?)
}

/// [`open`], with the raw limit `ratchet bench` measures against.
pub async fn open_measured(url: &str) -> Result<Arc<dyn MeasuredStore>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::open(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_string()))
    }
}

/// What [`Queue::listen_ended`] calls: with a run that may have ended, or
/// with `None` when anything may have.
pub type RunEnded = Box<dyn Fn(Option<&str>) + Send + Sync>;

/// Listening for ready jobs ([`Queue::listen_ready`]) stops when this is
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
