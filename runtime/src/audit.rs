//! Checks the three invariants over everything in the store, one run at a
//! time (memory bounded by the largest run, time linear in the rows). An
//! empty report means: one artifact per identity, every consumed input
//! canonical, no stage started before its predecessors committed, no
//! continuation missing.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::store::{AuditFacts, JobRow, JobState, NewEdge, RUN_INPUT_STAGE, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// `canonical-artifact`, `durable-dependency` or `atomic-continuation`.
    pub invariant: &'static str,
    pub run_id: String,
    pub stage: String,
    pub detail: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub runs: usize,
    pub jobs: usize,
    pub attempts: usize,
    pub artifacts: usize,
    pub violations: Vec<Violation>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    fn add(&mut self, other: AuditReport) {
        self.runs += other.runs;
        self.jobs += other.jobs;
        self.attempts += other.attempts;
        self.artifacts += other.artifacts;
        self.violations.extend(other.violations);
    }
}

/// Runs read per page when walking every run.
const RUNS_PER_PAGE: usize = 100;

/// Audits one run (`Some`) or every run, one run's rows in memory at a
/// time; `progress` is told the report so far after each run.
pub async fn audit_store(
    store: &dyn Store,
    run: Option<&str>,
    progress: &mut (dyn FnMut(&AuditReport) + Send),
) -> Result<AuditReport, StoreError> {
    let mut report = AuditReport::default();
    if let Some(run) = run {
        report.add(audit(&store.audit_facts(run).await?));
        progress(&report);
        return Ok(report);
    }
    let mut after: Option<String> = None;
    loop {
        let ids = store.run_ids(after.as_deref(), RUNS_PER_PAGE).await?;
        for id in &ids {
            report.add(audit(&store.audit_facts(id).await?));
            progress(&report);
        }
        if ids.len() < RUNS_PER_PAGE {
            return Ok(report);
        }
        after = ids.last().cloned();
    }
}

const CANONICAL: &str = "canonical-artifact";
const DEPENDENCY: &str = "durable-dependency";
const CONTINUATION: &str = "atomic-continuation";

/// Checks the rows of one run (or of several, read in one snapshot).
pub fn audit(facts: &AuditFacts) -> AuditReport {
    let mut v = Vec::new();
    let mut push = |invariant, run_id: &str, stage: &str, detail: String| {
        v.push(Violation {
            invariant,
            run_id: run_id.to_string(),
            stage: stage.to_string(),
            detail,
        })
    };

    let mut artifacts: HashMap<(&str, &str, &str), &str> = HashMap::new();
    for a in &facts.artifacts {
        let key = (a.run_id.as_str(), a.stage.as_str(), a.output.as_str());
        if artifacts.insert(key, a.digest.as_str()).is_some() {
            push(
                CANONICAL,
                &a.run_id,
                &a.stage,
                format!("output `{}` stored more than once", a.output),
            );
        }
    }
    let jobs: HashMap<(&str, &str), &JobRow> = facts
        .jobs
        .iter()
        .map(|j| ((j.run_id.as_str(), j.stage.as_str()), j))
        .collect();
    // (run, stage) -> [(input, from stage, from output)]
    type Bindings<'a> = HashMap<(&'a str, &'a str), Vec<(&'a str, &'a str, &'a str)>>;
    let mut bindings: Bindings<'_> = HashMap::new();
    for (run, b) in &facts.inputs {
        bindings
            .entry((run.as_str(), b.stage.as_str()))
            .or_default()
            .push((
                b.input.as_str(),
                b.from_stage.as_str(),
                b.from_output.as_str(),
            ));
    }

    for a in &facts.digest_mismatches {
        push(
            CANONICAL,
            &a.run_id,
            &a.stage,
            format!(
                "the stored bytes of `{}` no longer hash to its recorded digest {}",
                a.output, a.digest
            ),
        );
    }

    // (run, stage) -> its incoming edges
    let mut edges_into: HashMap<(&str, &str), Vec<&NewEdge>> = HashMap::new();
    for (run, edge, _) in &facts.edges {
        edges_into
            .entry((run.as_str(), edge.to_stage.as_str()))
            .or_default()
            .push(edge);
    }
    // job id -> the attempt numbers that record success
    let mut successes: HashMap<i64, Vec<i64>> = HashMap::new();
    for a in &facts.attempts {
        if a.outcome == "succeeded" {
            successes.entry(a.job_id).or_default().push(a.attempt);
        }
        for (output, digest) in a.canonical_digests.iter().flatten() {
            let stored = artifacts.get(&(a.run_id.as_str(), a.stage.as_str(), output.as_str()));
            if stored != Some(&digest.as_str()) {
                push(
                    CANONICAL,
                    &a.run_id,
                    &a.stage,
                    format!(
                        "attempt {} reported canonical `{output}` {digest}, but the store holds {stored:?}",
                        a.attempt
                    ),
                );
            }
        }
        let bound = bindings.get(&(a.run_id.as_str(), a.stage.as_str()));
        for (input, digest) in a.input_digests.iter().flatten() {
            let source = bound.and_then(|b| b.iter().find(|(i, _, _)| i == input));
            let canonical =
                source.and_then(|(_, s, o)| artifacts.get(&(a.run_id.as_str(), *s, *o)));
            if canonical != Some(&digest.as_str()) {
                push(
                    CANONICAL,
                    &a.run_id,
                    &a.stage,
                    format!(
                        "attempt {} consumed input `{input}` with digest {digest}, but the canonical artifact is {canonical:?}",
                        a.attempt
                    ),
                );
            }
        }
        let incoming = edges_into
            .get(&(a.run_id.as_str(), a.stage.as_str()))
            .map_or(&[][..], Vec::as_slice);
        // A PostgreSQL claim counts the satisfied edges it sees; only that
        // proves each predecessor committed first (ADR 0018).
        if let Some(seen) = a.deps_seen.filter(|&seen| seen != incoming.len() as i64) {
            push(
                DEPENDENCY,
                &a.run_id,
                &a.stage,
                format!(
                    "attempt {} was claimed when {seen} of its {} dependencies had committed",
                    a.attempt,
                    incoming.len()
                ),
            );
        }
        for edge in incoming {
            let pred = jobs.get(&(a.run_id.as_str(), edge.from_stage.as_str()));
            match pred.and_then(|p| p.succeeded_seq) {
                Some(seq) if seq < a.claim_seq => {}
                other => push(
                    DEPENDENCY,
                    &a.run_id,
                    &a.stage,
                    format!(
                        "attempt {} started (seq {}) before `{}` succeeded ({})",
                        a.attempt,
                        a.claim_seq,
                        edge.from_stage,
                        other.map_or("never".to_string(), |s| format!("seq {s}"))
                    ),
                ),
            }
        }
    }

    let mut unsatisfied: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for (run, edge, satisfied) in &facts.edges {
        let from = jobs.get(&(run.as_str(), edge.from_stage.as_str()));
        let from_succeeded = from.is_some_and(|j| j.state == JobState::Succeeded);
        if from_succeeded && !satisfied {
            push(
                CONTINUATION,
                run,
                &edge.from_stage,
                format!(
                    "succeeded, but its edge to `{}` was never satisfied",
                    edge.to_stage
                ),
            );
        }
        if !satisfied {
            *unsatisfied
                .entry((run.as_str(), edge.to_stage.as_str()))
                .or_default() += 1;
        }
    }
    let outbox: HashSet<&str> = facts.outbox.iter().map(|o| o.dedup_key.as_str()).collect();
    for row in &facts.outbox {
        // A row naming no job (a run's own event) is checked by its run.
        let job = jobs.get(&(row.run_id.as_str(), row.stage.as_str()));
        if let Some(job) = job.filter(|j| j.state != JobState::Succeeded) {
            push(
                CONTINUATION,
                &row.run_id,
                &row.stage,
                format!(
                    "outbox event `{}` was written, but the stage is {}",
                    row.event,
                    job.state.as_str()
                ),
            );
        }
    }
    // the first stage of each run that has not succeeded
    let mut unfinished: HashMap<&str, &JobRow> = HashMap::new();
    // (run, stage) -> the attempt that succeeded
    let mut winners: HashMap<(&str, &str), i64> = HashMap::new();
    for job in &facts.jobs {
        let (run, stage) = (job.run_id.as_str(), job.stage.as_str());
        if job.state != JobState::Succeeded {
            unfinished.entry(run).or_insert(job);
        }
        if job.state == JobState::Succeeded {
            match successes.get(&job.id).map(Vec::as_slice) {
                Some([winner]) if *winner == job.attempt => {
                    winners.insert((run, stage), *winner);
                }
                Some([winner]) => push(
                    CONTINUATION,
                    run,
                    stage,
                    format!(
                        "succeeded by attempt {winner}, but its last attempt is {}",
                        job.attempt
                    ),
                ),
                n => push(
                    CONTINUATION,
                    run,
                    stage,
                    format!(
                        "succeeded, but {} attempts record success",
                        n.map_or(0, <[i64]>::len)
                    ),
                ),
            }
            for output in &job.outputs {
                if !artifacts.contains_key(&(run, stage, output.as_str())) {
                    push(
                        CANONICAL,
                        run,
                        stage,
                        format!("succeeded without its output `{output}`"),
                    );
                }
            }
            for event in &job.emits {
                if !outbox.contains(format!("{run}/{stage}/{event}").as_str()) {
                    push(
                        CONTINUATION,
                        run,
                        stage,
                        format!("succeeded, but its `{event}` outbox row is missing"),
                    );
                }
            }
        }
        let open = unsatisfied.get(&(run, stage)).copied().unwrap_or(0);
        if matches!(job.state, JobState::Ready | JobState::Running) && open > 0 {
            push(
                DEPENDENCY,
                run,
                stage,
                format!(
                    "{}, but {open} incoming edges are unsatisfied",
                    job.state.as_str()
                ),
            );
        }
        if job.state == JobState::Blocked && (open == 0 || job.pending != open) {
            push(
                CONTINUATION,
                run,
                stage,
                format!(
                    "blocked with pending = {}, but {open} incoming edges are unsatisfied",
                    job.pending
                ),
            );
        }
    }
    for a in &facts.artifacts {
        let key = (a.run_id.as_str(), a.stage.as_str());
        if a.stage == RUN_INPUT_STAGE {
            continue;
        }
        match winners.get(&key) {
            Some(&winner) if winner == a.attempt => {}
            winner => push(
                CANONICAL,
                &a.run_id,
                &a.stage,
                format!(
                    "`{}` was stored by attempt {}, but {}",
                    a.output,
                    a.attempt,
                    winner.map_or("the stage has no succeeding attempt".to_string(), |w| {
                        format!("attempt {w} succeeded")
                    })
                ),
            ),
        }
    }
    for run in &facts.runs {
        // A failed run starts nothing new, unless an operator retried it.
        let retried = facts
            .events
            .iter()
            .any(|e| e.run_id == run.id && e.kind == "retry");
        if let Some(failed_seq) = run.failed_seq.filter(|_| !retried) {
            for a in facts
                .attempts
                .iter()
                .filter(|a| a.run_id == run.id && a.claim_seq > failed_seq)
            {
                push(
                    CONTINUATION,
                    &run.id,
                    &a.stage,
                    format!(
                        "attempt {} started (seq {}) after the run failed (seq {failed_seq})",
                        a.attempt, a.claim_seq
                    ),
                );
            }
        }
        match (unfinished.get(run.id.as_str()), run.state.as_str()) {
            (None, "succeeded") | (Some(_), "running" | "failed") => {}
            (None, state) => push(
                CONTINUATION,
                &run.id,
                "-",
                format!("every stage succeeded, but the run is `{state}`"),
            ),
            (Some(job), state) => push(
                CONTINUATION,
                &run.id,
                &job.stage,
                format!(
                    "the run is `{state}`, but this stage is {}",
                    job.state.as_str()
                ),
            ),
        }
    }

    AuditReport {
        runs: facts.runs.len(),
        jobs: facts.jobs.len(),
        attempts: facts.attempts.len(),
        artifacts: facts.artifacts.len(),
        violations: v,
    }
}
