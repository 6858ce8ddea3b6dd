//! One API for everything a program does with Ratchet: open a database,
//! register plugins, submit runs (also inside the caller's transaction),
//! wait for them, read what they made, cancel, retry and approve, and run
//! a worker in the caller's tokio runtime. The `ratchet` command line and
//! `ratchet serve` are thin layers over it (docs/embedding.md).
//!
//! ```no_run
//! use std::time::Duration;
//! use ratchet_runtime::client::Client;
//! use ratchet_runtime::manifest::Pipeline;
//! use ratchet_runtime::worker::WorkerOptions;
//!
//! # async fn demo(component: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::open("sqlite://ratchet.db").await?;
//! client.register(component).await?;
//! let pipeline = Pipeline::parse(
//!     "inline",
//!     "name = \"one\"\n[[stage]]\nname = \"a\"\nplugin = \"noop@^1\"\n",
//! )?;
//! let run = client.submit(&pipeline, b"hello".to_vec(), Some("order-17".into())).await?;
//! let worker = client.worker("embedded", WorkerOptions::default());
//! let finished = client.wait(&run.run_id, Duration::from_secs(30)).await?;
//! println!("{} {}", finished.id, finished.state);
//! worker.stop(Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```

mod builder;
mod error;
mod watch;
mod worker;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::clock::Clock;
use crate::manifest::Pipeline;
use crate::operator;
use crate::plugin::{Caps, PluginHost};
use crate::registry::{self, Registered, RegistryError};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::store::{
    self, Artifact, ArtifactMeta, AttemptRow, CallerTransaction, Decision, DeliveryFilter,
    DeliveryRow, JobRow, ModelCall, PluginCap, PluginSummary, Retried, RunEvent, RunGraph,
    RunQuery, RunRow, RunSubmitOutcome, SqliteStore, Store, Verdict,
};

pub use builder::ClientBuilder;
pub use error::{ClientError, ErrorKind, Result};
pub use watch::{RunChange, RunWatch};
pub use worker::WorkerHandle;

/// A run submitted: its id, and whether this call created it (`false`: its
/// idempotency key named a run submitted before, which is returned).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Submitted {
    pub run_id: String,
    pub created: bool,
}

impl From<RunSubmitOutcome> for Submitted {
    fn from(o: RunSubmitOutcome) -> Self {
        let created = matches!(o, RunSubmitOutcome::Created(_));
        Self {
            run_id: o.run_id().to_string(),
            created,
        }
    }
}

/// A run with its stages.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunRow,
    pub stages: Vec<JobRow>,
}

/// A page of runs, newest first, and the cursor of the next page (`None`
/// on the last).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunRow>,
    pub next_cursor: Option<String>,
}

/// A handle on one Ratchet database; cheap to clone and share.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    sqlite: Option<Arc<SqliteStore>>,
    host: Arc<PluginHost>,
    clock: Arc<dyn Clock>,
    caps: Arc<[PluginCap]>,
    limits: Caps,
    poll: Duration,
    /// Counts the changes this process made through this client (its
    /// embedded workers' commits and starts, its operations): what wakes
    /// its watches before their next read is due.
    changed: tokio::sync::watch::Sender<u64>,
    /// The runs other processes may have ended, as the store tells them
    /// (`None`: any run may have); started with the first watch.
    ended: tokio::sync::broadcast::Sender<Option<Arc<str>>>,
    listening: OnceLock<store::Listening>,
}

/// Ended runs told and not yet seen by a slow watch; one that falls further
/// behind reads its run again.
const ENDED_BACKLOG: usize = 1024;

impl Inner {
    fn changed(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Starts listening for runs other processes end, where the store can
    /// tell them (PostgreSQL), once per client and inside a tokio runtime.
    fn listen_ended(&self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.listening.get_or_init(|| {
            let ended = self.ended.clone();
            self.store.listen_ended(Box::new(move |run| {
                // No watch subscribed: nothing to wake.
                let _ = ended.send(run.map(Arc::from));
            }))
        });
    }
}

/// Tells a client's watches that its embedded worker committed or started
/// an attempt.
struct Wake(Arc<Inner>);

impl crate::scheduler::SchedulerProbe for Wake {
    fn released(&self, _run_id: &str, _stages: &[String]) {
        self.0.changed();
    }

    fn started(&self, _job: &crate::store::ClaimedJob) {
        self.0.changed();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Client {
    /// Opens the database a URL names (`sqlite://PATH`, `postgres://…`)
    /// with the default policy and model backend.
    pub async fn open(url: &str) -> Result<Self> {
        Self::builder(url).open().await
    }

    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(url.into())
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// On SQLite, the store itself: its [`SqliteStore::write`] lends the
    /// one writer's connection for the caller's own statements and a run
    /// submitted with them ([`Client::submit_in`]). `None` on PostgreSQL,
    /// where the caller begins its own transaction.
    pub fn sqlite(&self) -> Option<&SqliteStore> {
        self.inner.sqlite.as_deref()
    }

    pub fn host(&self) -> &Arc<PluginHost> {
        &self.inner.host
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The policy's `[caps]`, applied to every run this client submits.
    pub fn limits(&self) -> &Caps {
        &self.inner.limits
    }

    /// Registers a component (its bytes) under the name and version its
    /// manifest declares; registering the same bytes again is a no-op.
    pub async fn register(&self, component: Vec<u8>) -> Result<Registered> {
        let i = &self.inner;
        Ok(
            registry::plugin_register(i.store.as_ref(), &i.host, component, i.clock.as_ref())
                .await?,
        )
    }

    pub async fn plugins(&self) -> Result<Vec<PluginSummary>> {
        Ok(self.inner.store.plugin_list().await?)
    }

    /// Submits a run of `pipeline` on `input`. A second submit with the
    /// same `idempotency_key` writes nothing and returns the first run.
    pub async fn submit(
        &self,
        pipeline: &Pipeline,
        input: Vec<u8>,
        idempotency_key: Option<String>,
    ) -> Result<Submitted> {
        let i = &self.inner;
        let outcome = registry::run_submit(
            i.store.as_ref(),
            pipeline,
            input,
            idempotency_key,
            &i.limits,
            i.clock.as_ref(),
        )
        .await?;
        Ok(outcome.into())
    }

    /// [`Client::submit`] inside the caller's open transaction: the run
    /// exists if and only if the caller commits. On PostgreSQL pass
    /// `&mut *tx` of your own `sqlx::Transaction`; on SQLite, the
    /// connection [`SqliteStore::write`] of [`Client::sqlite`] lends (it
    /// holds the one writer while open). See docs/embedding.md.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # use ratchet_runtime::manifest::Pipeline;
    /// # use ratchet_runtime::store::StoreError;
    /// # async fn order(client: &Client, pipeline: &Pipeline) -> Result<(), ClientError> {
    /// // PostgreSQL: your own transaction.
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/test").await.map_err(StoreError::from)?;
    /// let mut tx = pool.begin().await.map_err(StoreError::from)?;
    /// client.submit_in(&mut *tx, pipeline, b"o-17".to_vec(), Some("o-17".into())).await?;
    /// tx.commit().await.map_err(StoreError::from)?;
    ///
    /// // SQLite: the transaction the one writer lends, committed on `Ok`.
    /// if let Some(sqlite) = client.sqlite() {
    ///     sqlite
    ///         .write(async |conn: &mut sqlx::SqliteConnection| {
    ///             client.submit_in(conn, pipeline, b"o-18".to_vec(), Some("o-18".into())).await
    ///         })
    ///         .await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn submit_in(
        &self,
        tx: impl CallerTransaction,
        pipeline: &Pipeline,
        input: Vec<u8>,
        idempotency_key: Option<String>,
    ) -> Result<Submitted> {
        let i = &self.inner;
        let outcome = registry::run_submit_in(
            i.store.as_ref(),
            tx,
            pipeline,
            input,
            idempotency_key,
            &i.limits,
            i.clock.as_ref(),
        )
        .await?;
        Ok(outcome.into())
    }

    /// A run with its stages.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # async fn show(client: &Client, run_id: &str) -> Result<(), ClientError> {
    /// let detail = client.run(run_id).await?;
    /// for stage in &detail.stages {
    ///     println!("{} {} (attempt {})", stage.stage, stage.state.as_str(), stage.attempt);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run(&self, run_id: &str) -> Result<RunDetail> {
        let run = self.run_row(run_id).await?;
        let stages = self.inner.store.job_list(run_id).await?;
        Ok(RunDetail { run, stages })
    }

    /// The run's own row, without its stages: what a read that only needs
    /// the run to exist asks for.
    async fn run_row(&self, run_id: &str) -> Result<RunRow> {
        let run = self.inner.store.run_get(run_id).await?;
        run.ok_or_else(|| no_run(run_id))
    }

    /// A page of runs, newest first; pass the page's `next_cursor` as
    /// `query.before` for the next one.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # use ratchet_runtime::store::{RunQuery, RunState};
    /// # async fn failed(client: &Client) -> Result<(), ClientError> {
    /// let mut query = RunQuery { state: Some(RunState::Failed), limit: 100, ..RunQuery::default() };
    /// loop {
    ///     let page = client.runs(&query).await?;
    ///     for run in &page.runs {
    ///         println!("{} {}", run.id, run.pipeline);
    ///     }
    ///     match page.next_cursor {
    ///         Some(cursor) => query.before = Some(cursor),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn runs(&self, query: &RunQuery) -> Result<RunPage> {
        let limit = query.limit.clamp(1, 1000);
        let mut q = query.clone();
        q.limit = limit + 1;
        let mut runs = self.inner.store.run_page(&q).await?;
        let more = runs.len() > limit;
        runs.truncate(limit);
        let next_cursor = more.then(|| runs.last().map(|r| r.id.clone())).flatten();
        Ok(RunPage { runs, next_cursor })
    }

    /// Every attempt of a run, or of one of its stages, oldest first.
    pub async fn attempts(&self, run_id: &str, stage: Option<&str>) -> Result<Vec<AttemptRow>> {
        let detail = self.run(run_id).await?;
        if let Some(stage) = stage
            && !detail.stages.iter().any(|j| j.stage == stage)
        {
            return Err(no_stage(run_id, stage));
        }
        let mut attempts = self.inner.store.attempt_list(run_id).await?;
        if let Some(stage) = stage {
            attempts.retain(|a| a.stage == stage);
        }
        Ok(attempts)
    }

    /// The canonical artifact `stage.output` of a run: its bytes and
    /// media type.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # async fn receipt(client: &Client, run_id: &str) -> Result<(), ClientError> {
    /// let receipt = client.artifact(run_id, "publish", "receipt").await?;
    /// println!("{} {}", receipt.meta.media_type, String::from_utf8_lossy(&receipt.bytes));
    /// # Ok(()) }
    /// ```
    pub async fn artifact(&self, run_id: &str, stage: &str, output: &str) -> Result<Artifact> {
        let found = self.inner.store.artifact_get(run_id, stage, output).await?;
        match found {
            Some(a) => Ok(a),
            None => {
                self.run_row(run_id).await?;
                Err(RegistryError::NotFound(format!(
                    "run `{run_id}` has no artifact `{stage}.{output}` (yet); `ratchet artifacts {run_id}` lists them"
                ))
                .into())
            }
        }
    }

    /// The run's graph as stored: its edges, each with whether it is
    /// satisfied, and where each stage's inputs are read from.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # async fn waits(client: &Client, run_id: &str) -> Result<(), ClientError> {
    /// let graph = client.graph(run_id).await?;
    /// for edge in graph.edges.iter().filter(|e| !e.satisfied) {
    ///     println!("{} waits for {}", edge.to_stage, edge.from_stage);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn graph(&self, run_id: &str) -> Result<RunGraph> {
        self.run_row(run_id).await?;
        Ok(self.inner.store.run_graph(run_id).await?)
    }

    pub async fn artifacts(&self, run_id: &str) -> Result<Vec<ArtifactMeta>> {
        self.run_row(run_id).await?;
        Ok(self.inner.store.artifact_list(run_id).await?)
    }

    /// The run's journal of model calls: what each stage asked and the
    /// answer it continued from.
    pub async fn model_calls(&self, run_id: &str) -> Result<Vec<ModelCall>> {
        self.run_row(run_id).await?;
        Ok(self.inner.store.model_call_list(run_id).await?)
    }

    /// The run's history: the operators' changes to it (upgrades,
    /// cancels, retries), oldest first.
    pub async fn history(&self, run_id: &str) -> Result<Vec<RunEvent>> {
        self.run_row(run_id).await?;
        Ok(self.inner.store.run_events(run_id).await?)
    }

    /// The outbox's deliveries to sinks.
    pub async fn deliveries(&self, filter: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
        Ok(self.inner.store.delivery_list(filter).await?)
    }

    /// Cancels a running run: its attempts in flight are fenced out and its
    /// waiting stages never start. Returns how many of each.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # use ratchet_runtime::client::ErrorKind;
    /// # async fn stop(client: &Client, run_id: &str) -> Result<(), ClientError> {
    /// match client.cancel(run_id, Some("wrong input".into()), "ops".into()).await {
    ///     Ok((in_flight, waiting)) => println!("{in_flight} fenced out, {waiting} never start"),
    ///     Err(e) if e.kind() == ErrorKind::Conflict => println!("already finished: {e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn cancel(
        &self,
        run_id: &str,
        reason: Option<String>,
        by: String,
    ) -> Result<(u64, u64)> {
        let i = &self.inner;
        let cancelled =
            operator::run_cancel(i.store.as_ref(), run_id, reason, by, i.clock.as_ref()).await?;
        i.changed();
        Ok(cancelled)
    }

    /// Retries a failed or cancelled run from the stages that did not
    /// succeed (from `stage`, if named); `fresh` discards their journaled
    /// model answers.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # async fn again(client: &Client, run_id: &str) -> Result<(), ClientError> {
    /// let retried = client.retry(run_id, None, false, "ops".into()).await?;
    /// println!("generation {}: {}", retried.generation, retried.stages.join(", "));
    /// # Ok(()) }
    /// ```
    pub async fn retry(
        &self,
        run_id: &str,
        stage: Option<String>,
        fresh: bool,
        by: String,
    ) -> Result<Retried> {
        let i = &self.inner;
        let clock = i.clock.as_ref();
        let retried =
            operator::run_retry(i.store.as_ref(), run_id, stage, fresh, by, clock).await?;
        i.changed();
        Ok(retried)
    }

    /// Approves or rejects the approval gate `stage` of a run.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # use ratchet_runtime::store::Verdict;
    /// # async fn approve(client: &Client, run_id: &str) -> Result<(), ClientError> {
    /// let note = Some("numbers checked".to_string());
    /// client.decide(run_id, "review", Verdict::Approved, "ana".into(), note).await?;
    /// # Ok(()) }
    /// ```
    pub async fn decide(
        &self,
        run_id: &str,
        stage: &str,
        verdict: Verdict,
        by: String,
        note: Option<String>,
    ) -> Result<Decision> {
        let i = &self.inner;
        let clock = i.clock.as_ref();
        let store = i.store.as_ref();
        let decided = operator::gate_decide(store, run_id, stage, verdict, by, note, clock).await?;
        i.changed();
        Ok(decided)
    }

    /// Watches a run: its current state first, then each change, until it
    /// has finished. Reads the run every `poll` (see [`ClientBuilder::poll`]),
    /// and at once when this client's own worker ([`Client::worker`]) or
    /// operations change something: in-process, a wait ends as the run's
    /// last commit returns. On PostgreSQL it also reads the run at once
    /// when any process ends it (`LISTEN`); on SQLite, another process's
    /// changes are read at the next poll.
    ///
    /// ```no_run
    /// # use ratchet_runtime::client::{Client, ClientError};
    /// # async fn follow(client: &Client, run_id: &str) -> Result<(), ClientError> {
    /// let mut watch = client.watch(run_id);
    /// while let Some(change) = watch.next().await? {
    ///     println!("{change:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn watch(&self, run_id: &str) -> RunWatch {
        let i = &self.inner;
        let wakes = watch::Wakes {
            changed: i.changed.subscribe(),
            ended: i.ended.subscribe(),
        };
        i.listen_ended();
        RunWatch::new(i.store.clone(), run_id, i.poll, wakes)
    }

    /// Waits until the run has finished (succeeded, failed or cancelled),
    /// at most `timeout`; returns it as it finished.
    pub async fn wait(&self, run_id: &str, timeout: Duration) -> Result<RunRow> {
        let mut watch = self.watch(run_id);
        let finished = tokio::time::timeout(timeout, async {
            while watch.next().await?.is_some() {}
            Ok::<_, ClientError>(())
        })
        .await;
        match finished {
            Ok(done) => {
                done?;
                self.run_row(run_id).await
            }
            Err(_) => Err(ClientError::Timeout {
                run: run_id.to_string(),
                state: watch.state().unwrap_or(store::RunState::Running),
                waited: timeout,
            }),
        }
    }

    /// Starts a worker on the caller's tokio runtime; stop it with
    /// [`WorkerHandle::stop`], which lets its attempts in flight finish.
    pub fn worker(
        &self,
        worker_id: impl Into<String>,
        options: crate::worker::WorkerOptions,
    ) -> WorkerHandle {
        let i = &self.inner;
        let mut config = SchedulerConfig::new(worker_id);
        config.caps = i.caps.clone();
        let wake = Arc::new(Wake(i.clone()));
        let sched = Arc::new(Scheduler::observed(
            i.store.clone(),
            i.host.clone(),
            i.clock.clone(),
            config,
            Some(wake),
        ));
        WorkerHandle::start(i.store.clone(), sched, i.clock.clone(), options)
    }

    /// A scheduler for this client's database with the policy's caps, for
    /// a worker the caller drives itself ([`crate::worker::run`]).
    pub fn scheduler(&self, mut config: SchedulerConfig) -> Arc<Scheduler> {
        let i = &self.inner;
        config.caps = i.caps.clone();
        Arc::new(Scheduler::new(
            i.store.clone(),
            i.host.clone(),
            i.clock.clone(),
            config,
        ))
    }
}

fn no_run(run_id: &str) -> ClientError {
    RegistryError::NotFound(format!(
        "no run `{run_id}` in this database (`ratchet status` lists the runs)"
    ))
    .into()
}

fn no_stage(run_id: &str, stage: &str) -> ClientError {
    RegistryError::NotFound(format!(
        "run `{run_id}` has no stage `{stage}` (`ratchet status {run_id}` lists them)"
    ))
    .into()
}
