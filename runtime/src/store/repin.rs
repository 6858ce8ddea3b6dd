//! Repinning a waiting job to another version of its plugin (hot swap):
//! the run and the job checked, the journal checked, the new version's
//! `after` edges added, the job repinned and the run's history told, in one
//! transaction. The order is decided here once; each backend supplies the
//! statements ([`RepinTx`]).

use super::rows::{repin_after_edges, repin_refusal, run_job_states};
use super::{JobRepin, RepinOutcome, Result};

/// The statements of a repin, inside one open transaction.
pub(crate) trait RepinTx {
    /// The run's state, its row locked where the backend locks rows.
    async fn run_state(&mut self, run_id: &str) -> Result<Option<String>>;
    /// The job's `(state, plugin_digest)`, its row locked likewise (no
    /// digest for an approval gate).
    async fn job_pin(
        &mut self,
        run_id: &str,
        stage: &str,
    ) -> Result<Option<(String, Option<String>)>>;
    /// Whether the stage has journaled a model call in this run.
    async fn journaled(&mut self, run_id: &str, stage: &str) -> Result<bool>;
    /// The run's edges as `(from, to)`.
    async fn edges(&mut self, run_id: &str) -> Result<Vec<(String, String)>>;
    /// The run's jobs as `(stage, state)`.
    async fn job_states(&mut self, run_id: &str) -> Result<Vec<(String, String)>>;
    /// An `after` edge from `from` into the repinned stage.
    async fn after_edge_insert(&mut self, r: &JobRepin, from: &str, satisfied: bool) -> Result<()>;
    /// The job pinned to `r.to_digest`, waiting for `waits` more edges
    /// (blocked when there are any).
    async fn job_repin(&mut self, r: &JobRepin, waits: i64) -> Result<()>;
    /// The upgrade in the run's history.
    async fn upgrade_record(&mut self, r: &JobRepin) -> Result<()>;
}

/// Repins (see [`super::Intake::job_repin`]). The caller commits on
/// [`RepinOutcome::Repinned`]; otherwise nothing was written.
pub(crate) async fn repin(tx: &mut impl RepinTx, r: &JobRepin) -> Result<RepinOutcome> {
    let run_state = tx.run_state(&r.run_id).await?;
    let job = tx.job_pin(&r.run_id, &r.stage).await?;
    let (Some(run_state), Some((job_state, pinned))) = (run_state, job) else {
        return Ok(RepinOutcome::NotFound);
    };
    let Some(pinned) = pinned else {
        return Ok(RepinOutcome::Gate);
    };
    if let Some(refused) = repin_refusal(&run_state, &job_state, &pinned, r) {
        return Ok(refused);
    }
    if tx.journaled(&r.run_id, &r.stage).await? {
        return Ok(RepinOutcome::Journaled);
    }
    // Edges and states read without further locks: an `after` stage that
    // succeeds while this commits leaves its new edge unsatisfied, and the
    // reconciler satisfies it (it repairs edges of succeeded stages).
    let added = if r.after.is_empty() {
        Vec::new()
    } else {
        let edges = tx.edges(&r.run_id).await?;
        let states = run_job_states(tx.job_states(&r.run_id).await?)?;
        match repin_after_edges(&r.stage, &r.after, &edges, &states) {
            Ok(added) => added,
            Err(reason) => return Ok(RepinOutcome::AfterRefused(reason)),
        }
    };
    for (from, satisfied) in &added {
        tx.after_edge_insert(r, from, *satisfied).await?;
    }
    let waits = added.iter().filter(|(_, satisfied)| !satisfied).count() as i64;
    tx.job_repin(r, waits).await?;
    tx.upgrade_record(r).await?;
    Ok(RepinOutcome::Repinned)
}
