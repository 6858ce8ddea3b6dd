//! The rows a batch of completions writes, worked out from the batch and
//! what the database answered: which attempts are live, what each stores,
//! which outbox, attempt and edge rows follow, and each outcome. No
//! database here; [`super::complete_many`] runs the steps.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::store::{
    ArtifactPut, CanonicalOutput, ClaimedAs, CompleteOutcome, JobBatch, JobBatchOutcome,
    JobComplete, Payload, Result, StoreError,
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
    pub artifact: &'a Payload,
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

/// What a success released: the edges it satisfied, and the `(run, stage)`
/// of each dependent that became ready, or that maps over a list (to be
/// expanded or joined in the same transaction, `store::map`).
#[derive(Default)]
pub(crate) struct Released {
    pub satisfied: Vec<EdgeSatisfied>,
    pub ready: Vec<(String, String)>,
    pub mapping: Vec<(String, String)>,
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

/// The proposals of the fenced jobs, each to be stored under its job's run
/// and stage, in the order of `proposals`.
pub(crate) fn puts_of_fenced<'a>(
    fenced: impl IntoIterator<Item = &'a Fenced>,
    proposals: &[Proposal<'a>],
) -> Vec<ArtifactPut<'a>> {
    let jobs: HashMap<(i64, i64), &Fenced> = fenced
        .into_iter()
        .map(|job| ((job.job_id, job.attempt), job))
        .collect();
    proposals
        .iter()
        .filter_map(|p| {
            let job = jobs.get(&(p.job_id, p.attempt))?;
            Some(ArtifactPut {
                run_id: &job.run_id,
                stage: &job.stage,
                artifact: p.artifact,
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
                c.outputs.iter().map(move |artifact| Proposal {
                    job_id: c.job_id,
                    attempt: c.attempt,
                    artifact,
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
pub(super) fn live_of(
    batch: &[JobComplete],
    order: &[usize],
    fenced: Vec<Fenced>,
) -> Vec<(usize, Fenced)> {
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

fn canonical_of(outputs: &[CanonicalOutput]) -> BTreeMap<&str, &str> {
    outputs
        .iter()
        .map(|o| (o.name.as_str(), o.digest.as_str()))
        .collect()
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
            ending: Vec::new(),
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
                caps: std::sync::Arc::new([]),
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
