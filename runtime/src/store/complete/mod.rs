//! Completions, one or many, in one transaction: the order of the steps and
//! what each job is fenced on are decided here once; each backend supplies
//! the statements ([`CompletionTx`]) in its own folder.
//!
//! Lock order, the same in every batch so that two batches (two worker
//! processes) cannot deadlock: the committing jobs by id (the fences), then
//! the dependents by `(run, stage)`, then the runs by id.

mod rows;

use std::collections::HashMap;

use super::map::{self, MapTx};
use super::{
    ArtifactPut, CanonicalArtifact, CanonicalOutput, CompleteOutcome, JobComplete, Result,
    StoreError,
};
pub(crate) use rows::*;

/// The steps of a batch of completions, inside one open transaction. Each
/// takes every row of its step at once, so a batch costs the same number of
/// round trips to the database whatever its size.
pub(crate) trait CompletionTx: MapTx {
    /// The job rows of the attempts that still hold their lease, locked in
    /// job id order where the backend locks rows (`attempts` is sorted by
    /// job id); an attempt left out is fenced out. Then the proposals of
    /// those that hold it ([`puts_of_fenced`]), each inserted unless its
    /// key is taken: the `(run, stage, output, digest)` of those inserted.
    async fn fence_and_insert(
        &mut self,
        attempts: &[AttemptKey<'_>],
        proposals: &[Proposal<'_>],
    ) -> Result<(Vec<Fenced>, Vec<StoredKey>)>;
    /// The stored `(run, stage, output, digest)` of each key in `puts`.
    async fn artifacts_read(&mut self, puts: &[ArtifactPut<'_>]) -> Result<Vec<StoredKey>>;
    /// Writes what the live attempts' success means: the outbox rows
    /// (unless their dedup key is already there), each job succeeded with a
    /// new value of the order shared by claims and completions as its
    /// `succeeded_seq`, each attempt's row, and the unsatisfied edges out of
    /// each of `s.from` satisfied. Then each dependent those edges point to
    /// loses them from its pending count, one per edge (on Postgres, rows
    /// locked in `(run, stage)` order). Returns the edges satisfied and the
    /// dependents released.
    async fn record_success_and_release(&mut self, s: &Success<'_>) -> Result<Released>;
    /// Finishes each run (sorted by id) that has no job left to do.
    async fn runs_finish_if_done(&mut self, runs: &[&str], now: i64) -> Result<()>;
}

/// Commits the outputs of every attempt in `batch` that still holds its
/// lease, canonical-first, with its success, its outbox rows, its attempt
/// row and its released dependents; an attempt fenced out changes nothing.
/// Outcomes come back in the order of `batch`, with the runs the batch may
/// have ended ([`JobBatchOutcome::ending`]). The caller commits.
pub(crate) async fn complete_many(
    tx: &mut impl CompletionTx,
    batch: &[JobComplete],
) -> Result<(Vec<CompleteOutcome>, Vec<String>)> {
    if batch.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let plan = BatchOrder::of(batch);
    let (fenced, inserted) = tx.fence_and_insert(&plan.keys, &plan.proposals).await?;
    let live = live_of(batch, &plan.order, fenced);
    if live.is_empty() {
        return Ok((vec![CompleteOutcome::LeaseLost; batch.len()], Vec::new()));
    }
    let outputs_of = persist_outputs(tx, batch, &live, &plan.proposals, inserted).await?;
    crate::crash::point_per_attempt("after_persist", live.len());
    let success = success_of(batch, &live, &outputs_of);
    let now = success.now;
    let released = tx.record_success_and_release(&success).await?;
    crate::crash::point("after_outbox_insert");
    // A mapped stage released is reported as released: its elements are.
    let ready: Vec<_> = released
        .ready
        .iter()
        .chain(&released.mapping)
        .cloned()
        .collect();
    let (released_by, runs) = releases_of(&live, &released.satisfied, &ready)?;
    if !runs.is_empty() {
        tx.runs_finish_if_done(&runs, now).await?;
    }
    // A map joined in `advance` may be its run's last stage.
    let mut ending: Vec<String> = runs.iter().map(|run| run.to_string()).collect();
    ending.extend(released.mapping.iter().map(|(run, _)| run.clone()));
    ending.sort_unstable();
    ending.dedup();
    map::advance(tx, released.mapping, now).await?;
    Ok((
        outcomes(batch.len(), &live, outputs_of, released_by),
        ending,
    ))
}

/// The stored winner of each put, in the order of `puts`: those
/// `inserted` (canonical-first, with the fence) won; the keys that were not
/// (a concurrent inserter's, committed by the time the insert returned)
/// are read back in one more step.
async fn put_canonical_all(
    tx: &mut impl CompletionTx,
    puts: &[ArtifactPut<'_>],
    inserted: Vec<StoredKey>,
) -> Result<Vec<CanonicalArtifact>> {
    let position: HashMap<(&str, &str, &str), usize> = puts
        .iter()
        .enumerate()
        .map(|(i, a)| ((a.run_id, a.stage, a.artifact.name.as_str()), i))
        .collect();
    let mut stored: Vec<Option<CanonicalArtifact>> = puts.iter().map(|_| None).collect();
    place_stored(&mut stored, &position, inserted, true);
    if stored.iter().any(Option::is_none) {
        let read = tx.artifacts_read(puts).await?;
        place_stored(&mut stored, &position, read, false);
    }
    stored
        .into_iter()
        .zip(puts)
        .map(|(canonical, a)| {
            canonical.ok_or_else(|| StoreError::Corrupt {
                table: "artifacts",
                detail: format!(
                    "`{}.{}` neither inserted nor stored",
                    a.stage, a.artifact.name
                ),
            })
        })
        .collect()
}

/// Each stored key at the position of its put, unless one is there.
fn place_stored(
    stored: &mut [Option<CanonicalArtifact>],
    position: &HashMap<(&str, &str, &str), usize>,
    keys: Vec<StoredKey>,
    inserted: bool,
) {
    for (run, stage, output, digest) in keys {
        if let Some(&i) = position.get(&(run.as_str(), stage.as_str(), output.as_str())) {
            stored[i].get_or_insert(CanonicalArtifact { digest, inserted });
        }
    }
}

/// The outputs of each live attempt, in the order of `live`: its
/// proposals' stored winners, `inserted` with the fence or read back.
async fn persist_outputs(
    tx: &mut impl CompletionTx,
    batch: &[JobComplete],
    live: &[(usize, Fenced)],
    proposals: &[Proposal<'_>],
    inserted: Vec<StoredKey>,
) -> Result<Vec<Vec<CanonicalOutput>>> {
    let puts = puts_of_fenced(live.iter().map(|(_, job)| job), proposals);
    let mut stored = if puts.is_empty() {
        Vec::new()
    } else {
        put_canonical_all(tx, &puts, inserted).await?
    }
    .into_iter();
    let mut outputs_of = Vec::with_capacity(live.len());
    for (i, _) in live {
        let mut outputs = Vec::with_capacity(batch[*i].outputs.len());
        for proposed in &batch[*i].outputs {
            let Some(canonical) = stored.next() else {
                return Err(StoreError::Corrupt {
                    table: "artifacts",
                    detail: "fewer stored artifacts than proposals".into(),
                });
            };
            outputs.push(CanonicalOutput {
                name: proposed.name.clone(),
                digest: canonical.digest,
                proposed_digest: proposed.digest.clone(),
                won: canonical.inserted,
            });
        }
        outputs_of.push(outputs);
    }
    Ok(outputs_of)
}
