//! Completions, one or many, in one transaction: the order of the steps and
//! what each job is fenced on are decided here once; each backend supplies
//! the statements ([`CompletionTx`]) in its own folder.
//!
//! Lock order, the same in every batch so that two batches (two worker
//! processes) cannot deadlock: the committing jobs by id (the fences), then
//! the dependents by `(run, stage)`, then the runs by id.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    CanonicalArtifact, CanonicalOutput, CanonicalPut, CompleteOutcome, JobComplete, Result,
};

/// The job row of an attempt that still holds its lease.
pub(crate) struct Fenced {
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

/// The statements of a completion, inside one open transaction.
pub(crate) trait CompletionTx {
    /// The job (locked where the backend locks rows) if `(job, attempt,
    /// worker)` still holds the lease; `None` fences the attempt out.
    async fn fence(&mut self, job_id: i64, attempt: i64, worker: &str) -> Result<Option<Fenced>>;
    /// Insert unless present; the stored winner either way.
    async fn artifact_put_canonical(&mut self, a: CanonicalPut<'_>) -> Result<CanonicalArtifact>;
    /// Inserts unless the dedup key is already there.
    async fn outbox_put(&mut self, o: &OutboxPut<'_>) -> Result<()>;
    /// Marks the job succeeded, with the next value of the order shared by
    /// claims and completions as its `succeeded_seq`.
    async fn job_succeed(&mut self, job_id: i64, now: i64) -> Result<()>;
    /// Satisfies the unsatisfied edges out of `stage`; their targets, one
    /// entry per edge.
    async fn edges_satisfy(&mut self, run_id: &str, stage: &str) -> Result<Vec<String>>;
    /// Takes `edges` off the dependent's pending count; whether that made
    /// it ready.
    async fn dependent_release(
        &mut self,
        run_id: &str,
        stage: &str,
        edges: i64,
        now: i64,
    ) -> Result<bool>;
    async fn attempt_succeed(&mut self, a: &AttemptSucceeded<'_>) -> Result<()>;
    async fn run_finish_if_done(&mut self, run_id: &str, now: i64) -> Result<()>;
    /// Tells other processes' workers that jobs became ready (Postgres).
    async fn ready_notify(&mut self) -> Result<()>;
}

/// Commits the outputs of every attempt in `batch` that still holds its
/// lease, canonical-first, with its success, its outbox rows, its attempt
/// row and its released dependents; an attempt fenced out changes nothing.
/// Outcomes come back in the order of `batch`. The caller commits.
pub(crate) async fn complete_many(
    tx: &mut impl CompletionTx,
    batch: &[JobComplete],
) -> Result<Vec<CompleteOutcome>> {
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by_key(|&i| (batch[i].job_id, batch[i].attempt));
    let mut live = Vec::with_capacity(batch.len());
    for &i in &order {
        let c = &batch[i];
        if let Some(job) = tx.fence(c.job_id, c.attempt, &c.worker).await? {
            live.push((i, job));
        }
    }

    let mut outputs_of: BTreeMap<usize, Vec<CanonicalOutput>> = BTreeMap::new();
    // Edges satisfied per dependent, and the last completion that satisfied one.
    let mut releases: BTreeMap<(String, String), (i64, usize)> = BTreeMap::new();
    let mut runs = BTreeSet::new();
    for (i, job) in &live {
        let c = &batch[*i];
        let outputs = persist_outputs(tx, c, job).await?;
        crate::crash::point("after_persist");
        let canonical: BTreeMap<&str, &str> = outputs
            .iter()
            .map(|o| (o.name.as_str(), o.digest.as_str()))
            .collect();
        for event in &job.emits {
            let payload = serde_json::json!({
                "event": event,
                "run_id": job.run_id,
                "stage": job.stage,
                "inputs": c.input_digests,
                "outputs": canonical,
            });
            let row = OutboxPut {
                dedup_key: format!("{}/{}/{event}", job.run_id, job.stage),
                run_id: &job.run_id,
                stage: &job.stage,
                event,
                payload: payload.to_string(),
                now: c.now,
            };
            tx.outbox_put(&row).await?;
        }
        crate::crash::point("after_outbox_insert");

        tx.job_succeed(c.job_id, c.now).await?;
        let dependents = tx.edges_satisfy(&job.run_id, &job.stage).await?;
        if dependents.is_empty() {
            // Only a completion that leaves no dependent waiting can be a
            // run's last.
            runs.insert(job.run_id.clone());
        }
        for to in dependents {
            let entry = releases.entry((job.run_id.clone(), to)).or_insert((0, *i));
            *entry = (entry.0 + 1, *i);
        }
        tx.attempt_succeed(&AttemptSucceeded {
            job_id: c.job_id,
            attempt: c.attempt,
            input_digests: &c.input_digests,
            proposals: outputs
                .iter()
                .map(|o| (o.name.as_str(), o.proposed_digest.as_str()))
                .collect(),
            canonical,
            all_won: outputs.iter().all(|o| o.won),
            now: c.now,
        })
        .await?;
        outputs_of.insert(*i, outputs);
    }

    let now = batch.iter().map(|c| c.now).max().unwrap_or_default();
    let mut released_by: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    // A run with a dependent this batch just satisfied edges into is not
    // finished: that dependent is still to run.
    runs.retain(|run| !releases.keys().any(|(r, _)| r == run));
    for ((run_id, stage), (edges, by)) in releases {
        if tx.dependent_release(&run_id, &stage, edges, now).await? {
            released_by.entry(by).or_default().push(stage);
        }
    }
    if !released_by.is_empty() {
        tx.ready_notify().await?;
    }
    for run_id in &runs {
        tx.run_finish_if_done(run_id, now).await?;
    }

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

/// Canonical-first insert of each proposal, bound straight from the
/// completion's bytes.
async fn persist_outputs(
    tx: &mut impl CompletionTx,
    c: &JobComplete,
    job: &Fenced,
) -> Result<Vec<CanonicalOutput>> {
    let mut outputs = Vec::with_capacity(c.outputs.len());
    for proposed in &c.outputs {
        let put = CanonicalPut {
            run_id: &job.run_id,
            stage: &job.stage,
            output: &proposed.name,
            media_type: &proposed.media_type,
            bytes: &proposed.bytes,
            digest: &proposed.digest,
            attempt: c.attempt,
            plugin_digest: Some(&job.plugin_digest),
            now: c.now,
        };
        let canonical = tx.artifact_put_canonical(put).await?;
        outputs.push(CanonicalOutput {
            name: proposed.name.clone(),
            digest: canonical.digest,
            proposed_digest: proposed.digest.clone(),
            won: canonical.inserted,
        });
    }
    Ok(outputs)
}
