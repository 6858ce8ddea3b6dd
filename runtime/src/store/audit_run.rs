//! What the invariant audit reads of one run (see
//! [`super::History::audit_run`]): the run's own rows, then its jobs a page
//! at a time with every row that belongs to their stages. The order is
//! decided here once; each backend supplies the reads ([`AuditTx`]) inside
//! one read snapshot of its own.

use super::{
    AUDIT_PAGE_JOBS, ArtifactMeta, AttemptRow, AuditVisitor, EarlyStart, IncomingEdges,
    InputBinding, JobRow, NewEdge, OutboxRow, Result, RunAuditFacts, RunEvent, RunRow,
    StageAuditPage,
};

/// The stages of a page: those of `run_id` in `(after, last]`.
#[derive(Clone, Copy)]
pub(crate) struct StageRange<'a> {
    pub run_id: &'a str,
    pub after: &'a str,
    pub last: &'a str,
}

/// The reads of an audit, each one statement, inside one snapshot.
pub(crate) trait AuditTx {
    async fn run(&mut self, run_id: &str) -> Result<Option<RunRow>>;
    async fn run_events(&mut self, run_id: &str) -> Result<Vec<RunEvent>>;
    /// The run's artifacts whose bytes no longer hash to their digest.
    async fn digest_mismatches(&mut self, run_id: &str) -> Result<Vec<ArtifactMeta>>;
    /// The run's artifacts under a stage it has no job for (its input
    /// aside).
    async fn orphan_artifacts(&mut self, run_id: &str) -> Result<Vec<ArtifactMeta>>;
    /// Up to `limit` jobs of the run after stage `after`, in stage order.
    async fn jobs_after(&mut self, run_id: &str, after: &str, limit: i64) -> Result<Vec<JobRow>>;
    /// In claim order.
    async fn attempts(&mut self, r: StageRange<'_>) -> Result<Vec<AttemptRow>>;
    /// In `(stage, output)` order.
    async fn artifacts(&mut self, r: StageRange<'_>) -> Result<Vec<ArtifactMeta>>;
    /// Each binding with the digest of the artifact it names, if stored.
    async fn inputs(&mut self, r: StageRange<'_>) -> Result<Vec<(InputBinding, Option<String>)>>;
    /// Per stage, its incoming edges counted.
    async fn incoming(&mut self, r: StageRange<'_>) -> Result<Vec<IncomingEdges>>;
    /// Attempts claimed before a predecessor succeeded, in claim order.
    async fn early_starts(&mut self, r: StageRange<'_>) -> Result<Vec<EarlyStart>>;
    /// Unsatisfied edges whose predecessor succeeded.
    async fn lost_edges(&mut self, r: StageRange<'_>) -> Result<Vec<NewEdge>>;
    /// In id order.
    async fn outbox(&mut self, r: StageRange<'_>) -> Result<Vec<OutboxRow>>;
    /// The run's own events (stage `''`), in id order.
    async fn lifecycle(&mut self, run_id: &str) -> Result<Vec<OutboxRow>>;
}

/// Hands `visitor` the run's facts, then its pages; nothing if the run does
/// not exist. The caller opens and ends the snapshot.
pub(crate) async fn run(
    tx: &mut impl AuditTx,
    run_id: &str,
    visitor: &mut dyn AuditVisitor,
) -> Result<()> {
    let Some(run) = tx.run(run_id).await? else {
        return Ok(());
    };
    visitor.run(RunAuditFacts {
        run,
        events: tx.run_events(run_id).await?,
        digest_mismatches: tx.digest_mismatches(run_id).await?,
        orphan_artifacts: tx.orphan_artifacts(run_id).await?,
        lifecycle: tx.lifecycle(run_id).await?,
    });
    let mut after = String::new();
    loop {
        let jobs = tx.jobs_after(run_id, &after, AUDIT_PAGE_JOBS).await?;
        let Some(last) = jobs.last().map(|j| j.stage.clone()) else {
            return Ok(());
        };
        let range = StageRange {
            run_id,
            after: &after,
            last: &last,
        };
        let page = StageAuditPage {
            attempts: tx.attempts(range).await?,
            artifacts: tx.artifacts(range).await?,
            inputs: tx.inputs(range).await?,
            incoming: tx.incoming(range).await?,
            early_starts: tx.early_starts(range).await?,
            lost_edges: tx.lost_edges(range).await?,
            outbox: tx.outbox(range).await?,
            jobs,
        };
        let full = page.jobs.len() as i64 == AUDIT_PAGE_JOBS;
        visitor.stages(page);
        if !full {
            return Ok(());
        }
        after = last;
    }
}
