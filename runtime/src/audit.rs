//! Checks the three invariants over everything in the store. An empty report
//! means: one artifact per identity, every consumed input canonical, no stage
//! started before its predecessors committed, no continuation missing.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::store::{AuditFacts, JobRow, JobState};

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
}

const CANONICAL: &str = "canonical-artifact";
const DEPENDENCY: &str = "durable-dependency";
const CONTINUATION: &str = "atomic-continuation";

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

    let mut successes: HashMap<i64, usize> = HashMap::new();
    for a in &facts.attempts {
        if a.outcome == "succeeded" {
            *successes.entry(a.job_id).or_default() += 1;
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
        for (run, edge, _) in facts
            .edges
            .iter()
            .filter(|(r, e, _)| *r == a.run_id && e.to_stage == a.stage)
        {
            let pred = jobs.get(&(run.as_str(), edge.from_stage.as_str()));
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
    let mut run_done: HashMap<&str, bool> = HashMap::new();
    for job in &facts.jobs {
        let (run, stage) = (job.run_id.as_str(), job.stage.as_str());
        *run_done.entry(run).or_insert(true) &= job.state == JobState::Succeeded;
        if job.state == JobState::Succeeded {
            match successes.get(&job.id) {
                Some(1) => {}
                n => push(
                    CONTINUATION,
                    run,
                    stage,
                    format!(
                        "succeeded, but {} attempts record success",
                        n.copied().unwrap_or(0)
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
    for run in &facts.runs {
        let all_succeeded = run_done.get(run.id.as_str()).copied().unwrap_or(true);
        if all_succeeded && run.state != "succeeded" {
            push(
                CONTINUATION,
                &run.id,
                "-",
                format!("every stage succeeded, but the run is `{}`", run.state),
            );
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
