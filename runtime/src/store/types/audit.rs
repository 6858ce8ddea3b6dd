//! What the invariant audit reads of a run, a page of jobs at a time.

use super::*;

/// What the audit reads of a run as a whole, before its stages.
#[derive(Debug, Clone)]
pub struct RunAuditFacts {
    pub run: RunRow,
    pub events: Vec<RunEvent>,
    /// Artifacts whose stored bytes no longer hash to their recorded digest.
    pub digest_mismatches: Vec<ArtifactMeta>,
    /// Artifacts stored under a stage the run has no job for (other than
    /// the run's input).
    pub orphan_artifacts: Vec<ArtifactMeta>,
    /// The run's own outbox events (`run.succeeded`, `run.failed`), in id
    /// order.
    pub lifecycle: Vec<OutboxRow>,
}

/// A page of a run's jobs (consecutive in stage order) and every row of
/// theirs the audit checks. Incoming edges arrive counted and, where one
/// breaks an invariant, one by one: a fan-in's edges never sit in memory.
#[derive(Debug, Clone, Default)]
pub struct StageAuditPage {
    pub jobs: Vec<JobRow>,
    pub attempts: Vec<AttemptRow>,
    pub artifacts: Vec<ArtifactMeta>,
    /// Each binding with the digest of the artifact it names, if stored.
    pub inputs: Vec<(InputBinding, Option<String>)>,
    pub incoming: Vec<IncomingEdges>,
    /// Attempts claimed before a predecessor succeeded.
    pub early_starts: Vec<EarlyStart>,
    /// Unsatisfied edges whose predecessor succeeded.
    pub lost_edges: Vec<NewEdge>,
    pub outbox: Vec<OutboxRow>,
}

/// Jobs per [`StageAuditPage`].
pub const AUDIT_PAGE_JOBS: i64 = 512;

/// How many edges lead into a stage, and how many of them are unsatisfied.
#[derive(Debug, Clone)]
pub struct IncomingEdges {
    pub stage: String,
    pub total: i64,
    pub unsatisfied: i64,
}

/// An attempt claimed (at `claim_seq`) before its predecessor `from_stage`
/// succeeded (at `from_succeeded_seq`, if ever).
#[derive(Debug, Clone)]
pub struct EarlyStart {
    pub stage: String,
    pub attempt: i64,
    pub claim_seq: i64,
    pub from_stage: String,
    pub from_succeeded_seq: Option<i64>,
}

/// Receives one run's audit rows from [`History::audit_run`](crate::store::History):
/// the run first, then its jobs a page at a time, all from one snapshot.
pub trait AuditVisitor: Send {
    fn run(&mut self, facts: RunAuditFacts);
    fn stages(&mut self, page: StageAuditPage);
}
