//! Completions, one or many, in one transaction: the order of the steps and
//! what each job is fenced on are decided here once; each backend supplies
//! the statements ([`CompletionTx`]) in its own folder.
//!
//! Lock order, the same in every batch so that two batches (two worker
//! processes) cannot deadlock: the committing jobs by id (the fences), then
//! the dependents by `(run, stage)`, then the runs by id.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{
    CanonicalArtifact, CanonicalOutput, CanonicalPut, ClaimedAs, CompleteOutcome, JobBatch,
    JobBatchOutcome, JobComplete, Result, StoreError,
};

/// An attempt to fence: it commits only while it still holds its lease.
pub(crate) struct AttemptKey<'a> {
    pub job_id: i64,
    pub attempt: i64,
    pub worker: &'a str,
    /// The job as the attempt's claim returned it.
    pub job: &'a ClaimedAs,
}

/// An output an attempt proposes, before its job row is fenced.
pub(crate) struct Proposal<'a> {
    pub job_id: i64,
    pub attempt: i64,
    pub output: &'a str,
    pub media_type: &'a str,
    pub bytes: &'a [u8],
    pub digest: &'a str,
    pub now: i64,
}

/// The job row of an attempt that still holds its lease.
pub(crate) struct Fenced {
    pub job_id: i64,
    pub attempt: i64,
    pub run_id: String,
    pub stage: String,
    pub plugin_digest: String,
    pub emits: Vec<String>,
}

/// One outbox row, written in the completion's transaction.
pub(crate) struct OutboxPut<'a> {
    pub dedup_key: String,
    pub run_id: &'a str,
    pub stage: &'a str,
    pub event: &'a str,
    pub payload: String,
    pub now: i64,
}

/// What the attempts table records about a successful attempt.
pub(crate) struct AttemptSucceeded<'a> {
    pub job_id: i64,
    pub attempt: i64,
    pub input_digests: &'a BTreeMap<String, String>,
    pub proposals: BTreeMap<&'a str, &'a str>,
    pub canonical: BTreeMap<&'a str, &'a str>,
    pub all_won: bool,
    pub now: i64,
}

/// `(run, stage, output, digest)` of a stored artifact.
pub(crate) type StoredKey = (String, String, String, String);

/// An edge a completion satisfied: `from_stage` succeeded in `run_id`.
pub(crate) struct EdgeSatisfied {
    pub run_id: String,
    pub from_stage: String,
    pub to_stage: String,
}

/// The rows a batch's live attempts write once their outputs are stored.
pub(crate) struct Success<'a> {
    pub outbox: Vec<OutboxPut<'a>>,
    pub job_ids: Vec<i64>,
    pub attempts: Vec<AttemptSucceeded<'a>>,
    /// `(run, stage)` of each job, whose outgoing edges are now satisfied.
    pub from: Vec<(&'a str, &'a str)>,
    pub now: i64,
}

/// The steps of a batch of completions, inside one open transaction. Each
/// takes every row of its step at once, so a batch costs the same number of
/// round trips to the database whatever its size.
pub(crate) trait CompletionTx {
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
    async fn artifacts_read(&mut self, puts: &[CanonicalPut<'_>]) -> Result<Vec<StoredKey>>;
    /// Writes what the live attempts' success means: the outbox rows
    /// (unless their dedup key is already there), each job succeeded with a
    /// new value of the order shared by claims and completions as its
    /// `succeeded_seq`, each attempt's row, and the unsatisfied edges out of
    /// each of `s.from` satisfied. Then each dependent those edges point to
    /// loses them from its pending count, one per edge (on Postgres, rows
    /// locked in `(run, stage)` order). Returns the edges satisfied and the
    /// `(run, stage)` of each dependent that became ready.
    async fn record_success_and_release(
        &mut self,
        s: &Success<'_>,
    ) -> Result<(Vec<EdgeSatisfied>, Vec<(String, String)>)>;
    /// Finishes each run (sorted by id) that has no job left to do.
    async fn runs_finish_if_done(&mut self, runs: &[&str], now: i64) -> Result<()>;
}

/// The proposals of the fenced jobs, each to be stored under its job's run
/// and stage, in the order of `proposals`.
pub(crate) fn puts_of_fenced<'a>(
    fenced: impl IntoIterator<Item = &'a Fenced>,
    proposals: &[Proposal<'a>],
) -> Vec<CanonicalPut<'a>> {
    let jobs: HashMap<(i64, i64), &Fenced> = fenced
        .into_iter()
        .map(|job| ((job.job_id, job.attempt), job))
        .collect();
    proposals
        .iter()
        .filter_map(|p| {
            let job = jobs.get(&(p.job_id, p.attempt))?;
            Some(CanonicalPut {
                run_id: &job.run_id,
                stage: &job.stage,
                output: p.output,
                media_type: p.media_type,
                bytes: p.bytes,
                digest: p.digest,
                attempt: p.attempt,
                plugin_digest: Some(&job.plugin_digest),
                now: p.now,
            })
        })
        .collect()
}

/// A batch's attempts in job id order (positions in the batch), their
/// fence keys and their proposals: what the fence and the insert take.
pub(crate) struct BatchOrder<'a> {
    pub order: Vec<usize>,
    pub keys: Vec<AttemptKey<'a>>,
    pub proposals: Vec<Proposal<'a>>,
}

impl<'a> BatchOrder<'a> {
    pub(crate) fn of(batch: &'a [JobComplete]) -> Self {
        let mut order: Vec<usize> = (0..batch.len()).collect();
        order.sort_by_key(|&i| (batch[i].job_id, batch[i].attempt));
        let keys = order
            .iter()
            .map(|&i| AttemptKey {
                job_id: batch[i].job_id,
                attempt: batch[i].attempt,
                worker: &batch[i].worker,
                job: &batch[i].job,
            })
            .collect();
        let proposals = order
            .iter()
            .flat_map(|&i| {
                let c = &batch[i];
                c.outputs.iter().map(move |proposed| Proposal {
                    job_id: c.job_id,
                    attempt: c.attempt,
                    output: &proposed.name,
                    media_type: &proposed.media_type,
                    bytes: &proposed.bytes,
                    digest: &proposed.digest,
                    now: c.now,
                })
            })
            .collect();
        Self {
            order,
            keys,
            proposals,
        }
    }

    /// Every attempt in job id order with its job as its claim returned
    /// it: the batch as it is when every attempt still holds its lease.
    pub(crate) fn as_claimed(&self) -> Vec<(usize, Fenced)> {
        self.order
            .iter()
            .zip(&self.keys)
            .map(|(&i, key)| (i, key.fenced_as_claimed()))
            .collect()
    }
}

impl AttemptKey<'_> {
    /// The job row of this attempt, as its claim returned it.
    pub(crate) fn fenced_as_claimed(&self) -> Fenced {
        Fenced {
            job_id: self.job_id,
            attempt: self.attempt,
            run_id: self.job.run_id.clone(),
            stage: self.job.stage.clone(),
            plugin_digest: self.job.plugin_digest.clone(),
            emits: self.job.emits.clone(),
        }
    }
}

/// Live attempts in job id order, each with its job row: the row's
/// attempt, not an earlier one of the same job in the same batch.
fn live_of(batch: &[JobComplete], order: &[usize], fenced: Vec<Fenced>) -> Vec<(usize, Fenced)> {
    let mut fenced: BTreeMap<i64, Fenced> =
        fenced.into_iter().map(|job| (job.job_id, job)).collect();
    order
        .iter()
        .filter_map(|&i| {
            let c = &batch[i];
            let current = fenced.get(&c.job_id)?.attempt == c.attempt;
            current
                .then(|| fenced.remove(&c.job_id))
                .flatten()
                .map(|job| (i, job))
        })
        .collect()
}

/// Commits the outputs of every attempt in `batch` that still holds its
/// lease, canonical-first, with its success, its outbox rows, its attempt
/// row and its released dependents; an attempt fenced out changes nothing.
/// Outcomes come back in the order of `batch`. The caller commits.
pub(crate) async fn complete_many(
    tx: &mut impl CompletionTx,
    batch: &[JobComplete],
) -> Result<Vec<CompleteOutcome>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let plan = BatchOrder::of(batch);
    let (fenced, inserted) = tx.fence_and_insert(&plan.keys, &plan.proposals).await?;
    let live = live_of(batch, &plan.order, fenced);
    if live.is_empty() {
        return Ok(vec![CompleteOutcome::LeaseLost; batch.len()]);
    }
    let outputs_of = persist_outputs(tx, batch, &live, &plan.proposals, inserted).await?;
    crate::crash::point_per_attempt("after_persist", live.len());
    let success = success_of(batch, &live, &outputs_of);
    let now = success.now;
    let (satisfied, ready) = tx.record_success_and_release(&success).await?;
    crate::crash::point("after_outbox_insert");
    let (released_by, runs) = releases_of(&live, &satisfied, &ready)?;
    if !runs.is_empty() {
        tx.runs_finish_if_done(&runs, now).await?;
    }
    Ok(outcomes(batch.len(), &live, outputs_of, released_by))
}

/// Each proposal of each live attempt as the stored canonical value: the
/// batch as it is when no other attempt stored an output first.
pub(crate) fn proposed_as_won(
    batch: &[JobComplete],
    live: &[(usize, Fenced)],
) -> Vec<Vec<CanonicalOutput>> {
    live.iter()
        .map(|(i, _)| {
            batch[*i]
                .outputs
                .iter()
                .map(|proposed| CanonicalOutput {
                    name: proposed.name.clone(),
                    digest: proposed.digest.clone(),
                    proposed_digest: proposed.digest.clone(),
                    won: true,
                })
                .collect()
        })
        .collect()
}

/// The rows the live attempts write once their outputs are stored
/// (`outputs_of`, in the order of `live`): outbox rows naming the canonical
/// outputs, the jobs' success, the attempts' rows, the edges to satisfy.
pub(crate) fn success_of<'a>(
    batch: &'a [JobComplete],
    live: &'a [(usize, Fenced)],
    outputs_of: &'a [Vec<CanonicalOutput>],
) -> Success<'a> {
    let mut outbox = Vec::new();
    for ((i, job), outputs) in live.iter().zip(outputs_of) {
        let c = &batch[*i];
        for event in &job.emits {
            let payload = serde_json::json!({
                "event": event,
                "run_id": job.run_id,
                "stage": job.stage,
                "inputs": c.input_digests,
                "outputs": canonical_of(outputs),
            });
            outbox.push(OutboxPut {
                dedup_key: crate::graph::outbox_dedup_key(&job.run_id, &job.stage, event),
                run_id: &job.run_id,
                stage: &job.stage,
                event,
                payload: payload.to_string(),
                now: c.now,
            });
        }
    }
    let attempts = live
        .iter()
        .zip(outputs_of)
        .map(|((i, _), outputs)| {
            let c = &batch[*i];
            AttemptSucceeded {
                job_id: c.job_id,
                attempt: c.attempt,
                input_digests: &c.input_digests,
                proposals: outputs
                    .iter()
                    .map(|o| (o.name.as_str(), o.proposed_digest.as_str()))
                    .collect(),
                canonical: canonical_of(outputs),
                all_won: outputs.iter().all(|o| o.won),
                now: c.now,
            }
        })
        .collect();
    Success {
        outbox,
        job_ids: live.iter().map(|(i, _)| batch[*i].job_id).collect(),
        attempts,
        from: live
            .iter()
            .map(|(_, job)| (job.run_id.as_str(), job.stage.as_str()))
            .collect(),
        now: batch.iter().map(|c| c.now).max().unwrap_or_default(),
    }
}

/// The stages each completion released, by its position in the batch.
pub(crate) type ReleasedBy = BTreeMap<usize, Vec<String>>;

/// The stages each live attempt released, and the runs (sorted) that may
/// now be done.
pub(crate) fn releases_of<'a>(
    live: &'a [(usize, Fenced)],
    satisfied: &'a [EdgeSatisfied],
    ready: &[(String, String)],
) -> Result<(ReleasedBy, Vec<&'a str>)> {
    // The last live completion (in job id order) that satisfied an edge
    // into each dependent: the one its release is reported to.
    let position: BTreeMap<(&str, &str), usize> = live
        .iter()
        .enumerate()
        .map(|(p, (_, job))| ((job.run_id.as_str(), job.stage.as_str()), p))
        .collect();
    let mut releases: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for edge in satisfied {
        let Some(&p) = position.get(&(edge.run_id.as_str(), edge.from_stage.as_str())) else {
            return Err(StoreError::Corrupt {
                table: "edges",
                detail: format!(
                    "an edge out of `{}` no completion satisfied",
                    edge.from_stage
                ),
            });
        };
        let by = releases
            .entry((edge.run_id.as_str(), edge.to_stage.as_str()))
            .or_insert(p);
        *by = (*by).max(p);
    }
    // Only a completion that leaves no dependent waiting can be a run's
    // last, and a run with a dependent this batch just satisfied edges into
    // is not finished: that dependent is still to run.
    let waiting: BTreeSet<&str> = releases.keys().map(|(run, _)| *run).collect();
    let runs: BTreeSet<&str> = live
        .iter()
        .map(|(_, job)| job.run_id.as_str())
        .filter(|run| !waiting.contains(run))
        .collect();

    let ready: BTreeSet<(&str, &str)> = ready
        .iter()
        .map(|(run, stage)| (run.as_str(), stage.as_str()))
        .collect();
    let mut released_by = ReleasedBy::new();
    for (&(run, stage), &p) in &releases {
        if ready.contains(&(run, stage)) {
            released_by
                .entry(live[p].0)
                .or_default()
                .push(stage.to_string());
        }
    }
    Ok((released_by, runs.into_iter().collect()))
}

/// Each completion's outcome, in the order of the batch (`n` of them).
pub(crate) fn outcomes(
    n: usize,
    live: &[(usize, Fenced)],
    outputs_of: Vec<Vec<CanonicalOutput>>,
    mut released_by: ReleasedBy,
) -> Vec<CompleteOutcome> {
    let mut outputs_of: BTreeMap<usize, Vec<CanonicalOutput>> =
        live.iter().map(|(i, _)| *i).zip(outputs_of).collect();
    (0..n)
        .map(|i| match outputs_of.remove(&i) {
            Some(outputs) => CompleteOutcome::Completed {
                outputs,
                released: released_by.remove(&i).unwrap_or_default(),
            },
            None => CompleteOutcome::LeaseLost,
        })
        .collect()
}

/// Whether a batch may have released a job it did not claim itself: only
/// then need other workers be told that jobs became ready. A claim that took
/// fewer jobs than it asked for took every ready job, released ones too.
pub(crate) fn released_unclaimed(batch: &JobBatch, outcome: &JobBatchOutcome) -> bool {
    let released = outcome
        .completed
        .iter()
        .any(|c| matches!(c, CompleteOutcome::Completed { released, .. } if !released.is_empty()));
    released
        && batch
            .claim
            .as_ref()
            .is_none_or(|c| outcome.claimed.len() >= c.limit.max(1))
}

/// The stored winner of each put, in the order of `puts`: those
/// `inserted` (canonical-first, with the fence) won; the keys that were not
/// (a concurrent inserter's, committed by the time the insert returned)
/// are read back in one more step.
async fn put_canonical_all(
    tx: &mut impl CompletionTx,
    puts: &[CanonicalPut<'_>],
    inserted: Vec<StoredKey>,
) -> Result<Vec<CanonicalArtifact>> {
    let position: HashMap<(&str, &str, &str), usize> = puts
        .iter()
        .enumerate()
        .map(|(i, a)| ((a.run_id, a.stage, a.output), i))
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
                detail: format!("`{}.{}` neither inserted nor stored", a.stage, a.output),
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

fn canonical_of(outputs: &[CanonicalOutput]) -> BTreeMap<&str, &str> {
    outputs
        .iter()
        .map(|o| (o.name.as_str(), o.digest.as_str()))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ClaimedJob, JobClaim};

    fn outcome(released: &[&str], claimed: usize) -> JobBatchOutcome {
        JobBatchOutcome {
            completed: vec![
                CompleteOutcome::LeaseLost,
                CompleteOutcome::Completed {
                    outputs: Vec::new(),
                    released: released.iter().map(|s| s.to_string()).collect(),
                },
            ],
            claimed: (0..claimed)
                .map(|i| ClaimedJob::fixture(i as i64, format!("other{i}")))
                .collect(),
        }
    }

    fn claiming(limit: Option<usize>) -> JobBatch {
        JobBatch {
            completions: Vec::new(),
            claim: limit.map(|limit| JobClaim {
                worker: "w".into(),
                now: 0,
                lease_ms: 1,
                limit,
                only_job: None,
            }),
        }
    }

    /// Skipping the notification whenever anything was claimed would leave
    /// a released job that a full claim passed over to other workers' polls.
    #[test]
    fn other_workers_are_told_unless_the_batch_claimed_every_ready_job() {
        assert!(released_unclaimed(&claiming(None), &outcome(&["b"], 0)));
        assert!(released_unclaimed(&claiming(Some(2)), &outcome(&["b"], 2)));
        assert!(!released_unclaimed(&claiming(Some(2)), &outcome(&["b"], 1)));
        assert!(!released_unclaimed(&claiming(None), &outcome(&[], 0)));
    }
}
