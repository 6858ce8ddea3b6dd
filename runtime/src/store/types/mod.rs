//! Parameter, row and outcome types of the store's roles
//! ([`Store`](super::Store)): artifacts and journaled model calls in
//! `artifacts.rs`, the registry's in `plugins.rs`, the audit's in
//! `audit.rs`.

mod artifacts;
mod audit;
mod control;
mod deliveries;
mod plugins;
mod stages;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

pub use crate::graph::{
    EdgeKind, InputBinding, NewEdge, Payload, RUN_INPUT_OUTPUT, RUN_INPUT_STAGE,
};
pub use artifacts::*;
pub use audit::*;
pub use control::*;
pub use deliveries::*;
pub use plugins::*;
pub use stages::*;

/// The error recorded on an attempt that was still running when another
/// stage of its run died: its job is cancelled and its result discarded.
pub const RUN_FAILED_IN_FLIGHT: &str =
    "the run failed while this attempt ran; its job was cancelled and its result is discarded";

/// Run states: a run is `running` until every stage succeeded, one died,
/// or an operator cancelled it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => RunState::Running,
            "succeeded" => RunState::Succeeded,
            "failed" => RunState::Failed,
            "cancelled" => RunState::Cancelled,
            _ => return None,
        })
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct RunSubmit {
    pub run_id: String,
    pub pipeline: String,
    pub idempotency_key: Option<String>,
    pub input: Vec<u8>,
    pub jobs: Vec<NewJob>,
    pub edges: Vec<NewEdge>,
    pub inputs: Vec<InputBinding>,
    pub now: i64,
}

impl RunSubmit {
    /// Each job's state and count of edges into it (`pending`) when the
    /// run starts, in `jobs` order: `ready` without edges (a gate
    /// `awaiting`), else `blocked`.
    pub(crate) fn initial_states(&self) -> Vec<(&'static str, i64)> {
        let mut into: std::collections::HashMap<&str, i64> = Default::default();
        for edge in &self.edges {
            *into.entry(edge.to_stage.as_str()).or_default() += 1;
        }
        self.jobs
            .iter()
            .map(|job| match into.get(job.stage.as_str()) {
                Some(&pending) => (JobState::Blocked.as_str(), pending),
                None if job.work.gate().is_some() => (JobState::Awaiting.as_str(), 0),
                None => (JobState::Ready.as_str(), 0),
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct NewJob {
    pub stage: String,
    pub work: StageWork,
    /// The list the stage maps over, if it does.
    pub map: Option<MapSpec>,
    /// Output -> the most elements it may hold, for each of the stage's
    /// outputs a later stage maps over.
    pub lists: BTreeMap<String, i64>,
    pub outputs: Vec<String>,
    pub emits: Vec<String>,
    pub max_attempts: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunSubmitOutcome {
    Created(String),
    /// The idempotency key was used before; nothing was written.
    Existing(String),
}

impl RunSubmitOutcome {
    pub fn run_id(&self) -> &str {
        match self {
            RunSubmitOutcome::Created(id) | RunSubmitOutcome::Existing(id) => id,
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RunRow {
    pub id: String,
    pub pipeline: String,
    pub state: RunState,
    pub idempotency_key: Option<String>,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
    #[serde(serialize_with = "crate::clock::as_rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<i64>,
    /// The order value taken when the run failed (ADR 0018).
    pub failed_seq: Option<i64>,
}

/// A page of runs, newest first ([`History::run_page`](super::History::run_page)).
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    pub state: Option<RunState>,
    pub pipeline: Option<String>,
    /// Only runs older than this one (the last id of the page before).
    pub before: Option<String>,
    /// Only the run submitted with this idempotency key.
    pub key: Option<String>,
    pub limit: usize,
}

/// A run's graph as stored: its happens-before edges, each with whether
/// it is satisfied, and where each stage's inputs are read from (a mapped
/// stage's elements included, once it was expanded).
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct RunGraph {
    pub edges: Vec<GraphEdge>,
    pub inputs: Vec<InputBinding>,
}

/// One happens-before edge of a run's graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct GraphEdge {
    pub from_stage: String,
    pub to_stage: String,
    pub kind: EdgeKind,
    /// `from_stage` committed its success.
    pub satisfied: bool,
}

#[derive(Debug, Clone)]
pub struct JobClaim {
    pub worker: String,
    pub now: i64,
    pub lease_ms: i64,
    /// Most jobs to claim (at least one is asked for).
    pub limit: usize,
    /// Claim only this job (a scheduler choosing its own order); `None`
    /// claims the oldest due jobs.
    pub only_job: Option<i64>,
    /// The operator's caps on attempts running at once per plugin, across
    /// every worker: a claim takes no job of a plugin at its cap.
    pub caps: Arc<[PluginCap]>,
}

/// What a worker's committer sends: completions, then a claim, in one
/// transaction. The claim sees the dependents the completions released.
#[derive(Debug, Clone, Default)]
pub struct JobBatch {
    pub completions: Vec<JobComplete>,
    pub claim: Option<JobClaim>,
}

#[derive(Debug, Clone, Default)]
pub struct JobBatchOutcome {
    /// One per completion, in order.
    pub completed: Vec<CompleteOutcome>,
    pub claimed: Vec<ClaimedJob>,
    /// The runs this batch may have ended: those of its completions that
    /// left no dependent waiting, and those of a map it released. For
    /// telling waiters to look again ([`Queue::listen_ended`]); a run named
    /// here may still be running.
    ///
    /// [`Queue::listen_ended`]: crate::store::Queue::listen_ended
    pub ending: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub job_id: i64,
    pub run_id: String,
    pub stage: String,
    pub plugin_digest: String,
    pub attempt: i64,
    pub max_attempts: i64,
    /// When this attempt was claimed (the clock's ms).
    pub claimed_at: i64,
    pub lease_expires_at: i64,
    /// Claimed from an attempt whose lease expired (its worker died or
    /// stalled), not from the ready queue.
    pub taken_over: bool,
    pub outputs: Vec<String>,
    pub emits: Vec<String>,
    /// Output -> the most elements it may hold, for each output a later
    /// stage maps over: the attempt fails unless each is a JSON array that
    /// short ([`map::list_elements`](crate::store::map::list_elements)).
    pub lists: BTreeMap<String, i64>,
    /// The job's canonical inputs, when the claim read them in its own
    /// transaction (SQLite always, Postgres in a batch); `None` when they
    /// are still to be read
    /// ([`Queue::job_inputs_load`](crate::store::Queue::job_inputs_load)).
    pub inputs: Option<Vec<LoadedInput>>,
}

/// What a completion's writes take from its job, as the claim returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedAs {
    pub run_id: String,
    pub stage: String,
    pub plugin_digest: String,
    pub emits: Vec<String>,
}

impl From<&ClaimedJob> for ClaimedAs {
    fn from(job: &ClaimedJob) -> Self {
        Self {
            run_id: job.run_id.clone(),
            stage: job.stage.clone(),
            plugin_digest: job.plugin_digest.clone(),
            emits: job.emits.clone(),
        }
    }
}

#[cfg(test)]
impl ClaimedJob {
    /// A first attempt of `stage` in run `r`, for unit tests that need a
    /// claimed job and never look it up.
    pub(crate) fn fixture(job_id: i64, stage: String) -> Self {
        Self {
            job_id,
            run_id: "r".into(),
            stage,
            plugin_digest: "p".into(),
            attempt: 1,
            max_attempts: 3,
            claimed_at: 0,
            lease_expires_at: 0,
            taken_over: false,
            outputs: Vec::new(),
            emits: Vec::new(),
            lists: BTreeMap::new(),
            inputs: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct JobComplete {
    pub job_id: i64,
    pub attempt: i64,
    pub worker: String,
    /// The job as the attempt's claim returned it. A backend may write the
    /// whole completion on it in one step; it checks it against the job
    /// row first, and a completion whose job row says otherwise is written
    /// from the row.
    pub job: ClaimedAs,
    /// What the attempt proposes, one payload per declared output.
    pub outputs: Vec<Payload>,
    /// Input name -> digest of the canonical bytes the attempt consumed.
    pub input_digests: BTreeMap<String, String>,
    pub now: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalOutput {
    pub name: String,
    pub digest: String,
    pub proposed_digest: String,
    /// The attempt's own proposal was inserted (it was first).
    pub won: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompleteOutcome {
    Completed {
        outputs: Vec<CanonicalOutput>,
        /// Stages this completion made ready.
        released: Vec<String>,
    },
    /// The lease was taken over (or the job already finished): nothing changed.
    LeaseLost,
}

/// The attempts a worker still runs, whose leases it extends
/// ([`Queue::job_leases_renew`](crate::store::Queue::job_leases_renew)).
#[derive(Debug, Clone)]
pub struct LeaseRenewal {
    pub worker: String,
    /// `(job id, attempt)` of each.
    pub attempts: Vec<(i64, i64)>,
    pub lease_expires_at: i64,
}

#[derive(Debug, Clone)]
pub struct JobFail {
    pub job_id: i64,
    pub attempt: i64,
    pub worker: String,
    pub error: String,
    pub retryable: bool,
    /// When to try again, if the job is retried.
    pub retry_at: i64,
    pub input_digests: BTreeMap<String, String>,
    pub now: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailOutcome {
    Retrying { at: i64 },
    Dead,
    LeaseLost,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct JobRow {
    pub id: i64,
    pub run_id: String,
    pub stage: String,
    /// `None` for an approval gate, which runs no plugin.
    pub plugin_digest: Option<String>,
    /// What an approval gate asks its approver to check.
    pub gate: Option<String>,
    /// How long a gate awaits its decision before rejecting itself.
    pub gate_timeout_ms: Option<i64>,
    /// The list a mapped stage maps over, `STAGE.OUTPUT`.
    pub map: Option<String>,
    /// How many elements it was expanded into, once it was.
    pub map_count: Option<i64>,
    pub state: JobState,
    pub pending: i64,
    pub attempt: i64,
    pub max_attempts: i64,
    pub lease_owner: Option<String>,
    #[serde(serialize_with = "crate::clock::as_rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub lease_expires_at: Option<i64>,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub next_run_at: i64,
    pub last_error: Option<String>,
    pub succeeded_seq: Option<i64>,
    pub outputs: Vec<String>,
    pub emits: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct JobSummary {
    /// Jobs per state, for the states work can still come from (`ready`
    /// and `running`) only: an index range, however long the history.
    pub counts: BTreeMap<String, i64>,
    /// Earliest time after `now` at which a ready job falls due or a lease
    /// expires.
    #[serde(serialize_with = "crate::clock::as_rfc3339::option")]
    pub next_due_at: Option<i64>,
    /// Running jobs whose lease lapsed by `now` on their last attempt: no
    /// claim takes them; [`Queue::reconcile`](crate::store::Queue::reconcile) ends them.
    pub lapsed_on_last_attempt: i64,
}

/// What `/metrics` reads from the store when scraped
/// ([`History::queue_gauges`](super::History::queue_gauges)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueGauges {
    /// Jobs due now.
    pub ready: i64,
    pub running: i64,
    /// When the longest-waiting due job fell due.
    pub oldest_ready_at: Option<i64>,
    pub deliveries_pending: i64,
    pub deliveries_dead: i64,
}

impl JobSummary {
    pub fn count(&self, state: JobState) -> i64 {
        self.counts.get(state.as_str()).copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AttemptRow {
    pub job_id: i64,
    pub attempt: i64,
    pub run_id: String,
    pub stage: String,
    pub worker: String,
    /// `None` for a gate's decision, which ran no plugin.
    pub plugin_digest: Option<String>,
    pub claim_seq: i64,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub claimed_at: i64,
    #[serde(serialize_with = "crate::clock::as_rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<i64>,
    pub outcome: String,
    pub error: Option<String>,
    pub input_digests: Option<BTreeMap<String, String>>,
    pub proposal_digests: Option<BTreeMap<String, String>>,
    pub canonical_digests: Option<BTreeMap<String, String>>,
    pub proposal_won: Option<bool>,
    /// How many of the stage's incoming edges were satisfied in the claim's
    /// snapshot (PostgreSQL claims; ADR 0018).
    pub deps_seen: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct OutboxRow {
    pub id: i64,
    pub dedup_key: String,
    pub run_id: String,
    pub stage: String,
    pub event: String,
    pub payload: String,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    pub created_at: i64,
}

/// What one reconcile repaired, and in how many transactions: it works in
/// bounded batches (`store/reconcile.rs`), never one transaction over the
/// whole database.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    pub dead_expired_leases: u64,
    pub pending_repaired: u64,
    pub edges_repaired: u64,
    pub runs_finished: u64,
    /// Approval gates rejected because their timeout passed.
    pub gates_timed_out: u64,
    /// Write transactions it took (one per batch).
    pub transactions: u64,
}

impl ReconcileReport {
    /// Whether anything was repaired.
    pub fn changed(&self) -> bool {
        self.dead_expired_leases
            + self.pending_repaired
            + self.edges_repaired
            + self.runs_finished
            + self.gates_timed_out
            > 0
    }
}

/// What [`Queue::jobs_vacuum`](crate::store::Queue) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobsVacuum {
    /// Too few dead row versions to be worth it, or a database that keeps
    /// none.
    NotDue,
    Vacuumed,
    /// Due, but the database role may not vacuum the table (PostgreSQL:
    /// only its owner, the database's owner or a superuser may); the
    /// reason, for the operator.
    NotPermitted(String),
}

#[derive(Debug, Clone)]
pub struct JobRepin {
    pub run_id: String,
    pub stage: String,
    /// The digest the caller checked compatibility against; the repin is
    /// refused if the job is pinned to something else by now.
    pub from_digest: String,
    pub to_digest: String,
    pub emits: Vec<String>,
    /// The new version's `after` stages: each becomes an ordering edge
    /// into the stage, in the repin's transaction.
    pub after: Vec<String>,
    /// Recorded in the run's history.
    pub detail: String,
    pub now: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepinOutcome {
    Repinned,
    /// The run or stage does not exist.
    NotFound,
    /// The run is no longer running.
    RunFinished(String),
    /// The job is not waiting (`running`, `succeeded`, `dead`, ...).
    JobNotWaiting(JobState),
    /// The job was pinned to another digest than `from_digest`.
    PinMoved(String),
    /// The stage journaled model answers under its pinned version.
    Journaled,
    /// The new version's `after` cannot be kept in this run (the reason).
    AfterRefused(String),
    /// The stage is an approval gate: it runs no plugin.
    Gate,
}

/// One entry of a run's history: an operator's change to it (`kind`
/// `upgrade`: a stage repinned to another version; `cancel`; `retry`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RunEvent {
    pub run_id: String,
    pub stage: Option<String>,
    pub kind: String,
    pub detail: String,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub at: i64,
}

/// One transaction of the completion's statement shape, for the raw limit
/// `ratchet bench` measures.
#[derive(Debug, Clone, Copy)]
pub struct RawCompletion<'a> {
    pub job_id: i64,
    pub put: ArtifactPut<'a>,
}
