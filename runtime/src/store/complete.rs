//! Completions, one or many, in one transaction: the order of the steps and
//! what each job is fenced on are decided here once; each backend supplies
//! the statements ([`CompletionTx`]) in its own folder.
//!
//! Lock order, the same in every batch so that two batches (two worker
//! processes) cannot deadlock: the committing jobs by id (the fences), then
//! the dependents by `(run, stage)`, then the runs by id.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{
    CanonicalArtifact, CanonicalOutput, CanonicalPut, CompleteOutcome, JobBatch, JobBatchOutcome,
    JobComplete, Result, StoreError,
};

/// An attempt to fence: it commits only while it still holds its lease.
pub(crate) struct AttemptKey<'a> {
    pub job_id: i64,
    pub attempt: i64,
    pub worker: &'a str,
}

/// The job row of an attempt that still holds its lease.
pub(crate) struct Fenced {
    pub job_id: i64,
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

/// Edges to take off a dependent's pending count.
pub(crate) struct DependentRelease<'a> {
    pub run_id: &'a str,
    pub stage: &'a str,
    pub edges: i64,
}

/// The steps of a batch of completions, inside one open transaction. Each
/// takes every row of its step at once, so a batch costs the same number of
/// round trips to the database whatever its size.
pub(crate) trait CompletionTx {
    /// The job rows of the attempts that still hold their lease, locked in
    /// job id order where the backend locks rows (`attempts` is sorted by
    /// job id); an attempt left out is fenced out.
    async fn fence(&mut self, attempts: &[AttemptKey<'_>]) -> Result<Vec<Fenced>>;
    /// Inserts each unless its key is taken; the `(run, stage, output,
    /// digest)` of those it inserted.
    async fn artifacts_insert(&mut self, puts: &[CanonicalPut<'_>]) -> Result<Vec<StoredKey>>;
    /// The stored `(run, stage, output, digest)` of each key in `puts`.
    async fn artifacts_read(&mut self, puts: &[CanonicalPut<'_>]) -> Result<Vec<StoredKey>>;
    /// Writes what the live attempts' success means, in one step: the
    /// outbox rows (unless their dedup key is already there), each job
    /// succeeded with a new value of the order shared by claims and
    /// completions as its `succeeded_seq`, each attempt's row, and the
    /// unsatisfied edges out of each of `s.from` satisfied. Returns those
    /// edges.
    async fn record_success(&mut self, s: &Success<'_>) -> Result<Vec<EdgeSatisfied>>;
    /// Takes the edges off each dependent's pending count (sorted by `(run,
    /// stage)`, the order rows are locked in); whether each became ready.
    async fn dependents_release(
        &mut self,
        dependents: &[DependentRelease<'_>],
        now: i64,
    ) -> Result<Vec<bool>>;
    /// Finishes each run (sorted by id) that has no job left to do.
    async fn runs_finish_if_done(&mut self, runs: &[&str], now: i64) -> Result<()>;
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
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by_key(|&i| (batch[i].job_id, batch[i].attempt));
    let keys: Vec<AttemptKey> = order
        .iter()
        .map(|&i| AttemptKey {
            job_id: batch[i].job_id,
            attempt: batch[i].attempt,
            worker: &batch[i].worker,
        })
        .collect();
    let mut fenced: BTreeMap<i64, Fenced> = tx
        .fence(&keys)
        .await?
        .into_iter()
        .map(|job| (job.job_id, job))
        .collect();
    // Live attempts in job id order, each with its job row.
    let live: Vec<(usize, Fenced)> = order
        .iter()
        .filter_map(|&i| fenced.remove(&batch[i].job_id).map(|job| (i, job)))
        .collect();
    if live.is_empty() {
        return Ok(vec![CompleteOutcome::LeaseLost; batch.len()]);
    }

    let outputs_of = persist_outputs(tx, batch, &live).await?;
    let mut outbox = Vec::new();
    for ((i, job), outputs) in live.iter().zip(&outputs_of) {
        crate::crash::point("after_persist");
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
                dedup_key: format!("{}/{}/{event}", job.run_id, job.stage),
                run_id: &job.run_id,
                stage: &job.stage,
                event,
                payload: payload.to_string(),
                now: c.now,
            });
        }
    }

    let attempts: Vec<AttemptSucceeded> = live
        .iter()
        .zip(&outputs_of)
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
    let now = batch.iter().map(|c| c.now).max().unwrap_or_default();
    let success = Success {
        outbox,
        job_ids: live.iter().map(|(i, _)| batch[*i].job_id).collect(),
        attempts,
        from: live
            .iter()
            .map(|(_, job)| (job.run_id.as_str(), job.stage.as_str()))
            .collect(),
        now,
    };
    let satisfied = tx.record_success(&success).await?;
    crate::crash::point("after_outbox_insert");

    // Edges satisfied per dependent, and the last live completion (in job
    // id order) that satisfied one: the one a release is reported to.
    let position: BTreeMap<(&str, &str), usize> = live
        .iter()
        .enumerate()
        .map(|(p, (_, job))| ((job.run_id.as_str(), job.stage.as_str()), p))
        .collect();
    let mut releases: BTreeMap<(&str, &str), (i64, usize)> = BTreeMap::new();
    for edge in &satisfied {
        let Some(&p) = position.get(&(edge.run_id.as_str(), edge.from_stage.as_str())) else {
            return Err(StoreError::Corrupt {
                table: "edges",
                detail: format!(
                    "an edge out of `{}` no completion satisfied",
                    edge.from_stage
                ),
            });
        };
        let entry = releases
            .entry((edge.run_id.as_str(), edge.to_stage.as_str()))
            .or_insert((0, p));
        *entry = (entry.0 + 1, entry.1.max(p));
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

    let mut released_by: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    if !releases.is_empty() {
        let dependents: Vec<DependentRelease> = releases
            .iter()
            .map(|(&(run_id, stage), &(edges, _))| DependentRelease {
                run_id,
                stage,
                edges,
            })
            .collect();
        let ready = tx.dependents_release(&dependents, now).await?;
        for ((&(_, stage), &(_, p)), ready) in releases.iter().zip(ready) {
            if ready {
                let by = live[p].0;
                released_by.entry(by).or_default().push(stage.to_string());
            }
        }
    }
    if !runs.is_empty() {
        tx.runs_finish_if_done(&runs.into_iter().collect::<Vec<_>>(), now)
            .await?;
    }

    let mut outputs_of: BTreeMap<usize, Vec<CanonicalOutput>> =
        live.iter().map(|(i, _)| *i).zip(outputs_of).collect();
    Ok((0..batch.len())
        .map(|i| match outputs_of.remove(&i) {
            Some(outputs) => CompleteOutcome::Completed {
                outputs,
                released: released_by.remove(&i).unwrap_or_default(),
            },
            None => CompleteOutcome::LeaseLost,
        })
        .collect())
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

/// Canonical-first insert of every put in one step; the keys it did not
/// insert (a concurrent inserter's, committed by the time the insert
/// returns) are read back in one more. The stored winner of each put, in
/// the order of `puts`.
async fn put_canonical_all(
    tx: &mut impl CompletionTx,
    puts: &[CanonicalPut<'_>],
) -> Result<Vec<CanonicalArtifact>> {
    let mut stored: HashMap<(String, String, String), CanonicalArtifact> = HashMap::new();
    for (run, stage, output, digest) in tx.artifacts_insert(puts).await? {
        let won = CanonicalArtifact {
            digest,
            inserted: true,
        };
        stored.insert((run, stage, output), won);
    }
    if stored.len() < puts.len() {
        for (run, stage, output, digest) in tx.artifacts_read(puts).await? {
            stored
                .entry((run, stage, output))
                .or_insert(CanonicalArtifact {
                    digest,
                    inserted: false,
                });
        }
    }
    puts.iter()
        .map(|a| {
            let key = (
                a.run_id.to_string(),
                a.stage.to_string(),
                a.output.to_string(),
            );
            stored.remove(&key).ok_or_else(|| StoreError::Corrupt {
                table: "artifacts",
                detail: format!("`{}.{}` neither inserted nor stored", a.stage, a.output),
            })
        })
        .collect()
}

/// Whether each dependent became ready, in the order of `dependents`, from
/// the `(run, stage)` a backend saw turn ready.
pub(crate) fn ready_in_order(
    dependents: &[DependentRelease<'_>],
    ready: &[(String, String)],
) -> Vec<bool> {
    dependents
        .iter()
        .map(|d| ready.iter().any(|(r, s)| r == d.run_id && s == d.stage))
        .collect()
}

fn canonical_of(outputs: &[CanonicalOutput]) -> BTreeMap<&str, &str> {
    outputs
        .iter()
        .map(|o| (o.name.as_str(), o.digest.as_str()))
        .collect()
}

/// Canonical-first insert of every live attempt's proposals in one
/// statement, bound straight from the completions' bytes; the outputs of
/// each attempt, in the order of `live`.
async fn persist_outputs(
    tx: &mut impl CompletionTx,
    batch: &[JobComplete],
    live: &[(usize, Fenced)],
) -> Result<Vec<Vec<CanonicalOutput>>> {
    let puts: Vec<CanonicalPut> = live
        .iter()
        .flat_map(|(i, job)| {
            let c = &batch[*i];
            c.outputs.iter().map(move |proposed| CanonicalPut {
                run_id: &job.run_id,
                stage: &job.stage,
                output: &proposed.name,
                media_type: &proposed.media_type,
                bytes: &proposed.bytes,
                digest: &proposed.digest,
                attempt: c.attempt,
                plugin_digest: Some(&job.plugin_digest),
                now: c.now,
            })
        })
        .collect();
    let mut stored = if puts.is_empty() {
        Vec::new()
    } else {
        put_canonical_all(tx, &puts).await?
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
                .map(|i| ClaimedJob {
                    job_id: i as i64,
                    run_id: "r".into(),
                    stage: format!("other{i}"),
                    plugin_digest: "p".into(),
                    attempt: 1,
                    max_attempts: 3,
                    lease_expires_at: 0,
                    outputs: Vec::new(),
                    emits: Vec::new(),
                })
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
