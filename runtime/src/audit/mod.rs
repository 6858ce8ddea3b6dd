//! Checks the three invariants over everything in the store, one run at a
//! time and a page of a run's jobs at a time (memory bounded by a page
//! whatever the size of a run, time linear in the rows). An
//! empty report means: one artifact per identity, every consumed input
//! canonical, no stage started before its predecessors committed, no
//! continuation missing.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

mod deliveries;

pub use deliveries::audit_deliveries;

use crate::graph::outbox_dedup_key;
use crate::store::{
    ArtifactMeta, AuditVisitor, History, IncomingEdges, JobRow, JobState, RUN_INPUT_STAGE,
    RunAuditFacts, RunRow, RunState, StageAuditPage, StoreError,
};

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

/// Runs read per page when walking every run.
const RUNS_PER_PAGE: usize = 100;

/// Audits one run (`Some`) or every run, a page of one run's jobs in memory
/// at a time; `progress` is told the report so far after each page.
pub async fn audit_store(
    store: &dyn History,
    run: Option<&str>,
    progress: &mut (dyn FnMut(&AuditReport) + Send),
) -> Result<AuditReport, StoreError> {
    let mut report = AuditReport::default();
    if let Some(run) = run {
        audit_run(store, run, &mut report, progress).await?;
        return Ok(report);
    }
    let mut after: Option<String> = None;
    loop {
        let ids = store.run_ids(after.as_deref(), RUNS_PER_PAGE).await?;
        for id in &ids {
            audit_run(store, id, &mut report, progress).await?;
        }
        if ids.len() < RUNS_PER_PAGE {
            return Ok(report);
        }
        after = ids.last().cloned();
    }
}

async fn audit_run(
    store: &dyn History,
    run_id: &str,
    report: &mut AuditReport,
    progress: &mut (dyn FnMut(&AuditReport) + Send),
) -> Result<(), StoreError> {
    let mut audit = RunAudit {
        report,
        progress,
        run: None,
        retried: false,
        unfinished: None,
        lifecycle: Vec::new(),
    };
    store.audit_run(run_id, &mut audit).await?;
    audit.finish();
    Ok(())
}

const CANONICAL: &str = "canonical-artifact";
const DEPENDENCY: &str = "durable-dependency";
const CONTINUATION: &str = "atomic-continuation";

/// The checks of one run, fed by [`History::audit_run`]: rows that belong
/// together (a stage's job, attempts, artifacts, bindings, outbox rows and
/// counted incoming edges) arrive in one page; what spans the run (its
/// state against its stages') is carried from page to page.
struct RunAudit<'a> {
    report: &'a mut AuditReport,
    progress: &'a mut (dyn FnMut(&AuditReport) + Send),
    run: Option<RunRow>,
    /// Whether an operator retried the run (a failed run may start work
    /// again after that).
    retried: bool,
    /// The first stage of the run that has not succeeded, and its state.
    unfinished: Option<(String, JobState)>,
    /// The run's own events, in commit order.
    lifecycle: Vec<String>,
}

impl RunAudit<'_> {
    fn push(&mut self, invariant: &'static str, stage: &str, detail: String) {
        let run_id = self.run.as_ref().map_or("", |r| r.id.as_str());
        self.report.violations.push(Violation {
            invariant,
            run_id: run_id.to_string(),
            stage: stage.to_string(),
            detail,
        });
    }

    /// An artifact stored by `attempt`, where `winner` is the attempt that
    /// succeeded, if any.
    fn check_writer(&mut self, a: &ArtifactMeta, winner: Option<i64>) {
        if a.stage == RUN_INPUT_STAGE || winner == Some(a.attempt) {
            return;
        }
        let winner = winner.map_or("the stage has no succeeding attempt".to_string(), |w| {
            format!("attempt {w} succeeded")
        });
        let detail = format!(
            "`{}` was stored by attempt {}, but {winner}",
            a.output, a.attempt
        );
        self.push(CANONICAL, &a.stage, detail);
    }

    /// Attempts of the page against what they consumed and produced, and
    /// against the run's failure.
    fn check_attempts(
        &mut self,
        page: &StageAuditPage,
        artifacts: &HashMap<(&str, &str), &str>,
        incoming: &HashMap<&str, &IncomingEdges>,
    ) {
        // (stage, input) -> the digest of the artifact the binding names
        let bindings: HashMap<(&str, &str), Option<&str>> = page
            .inputs
            .iter()
            .map(|(b, digest)| ((b.stage.as_str(), b.input.as_str()), digest.as_deref()))
            .collect();
        // A failed or cancelled run's `failed_seq` is its last failure's: a
        // retry since would have made it running again.
        let failed_seq = self
            .run
            .as_ref()
            .filter(|r| matches!(r.state, RunState::Failed | RunState::Cancelled))
            .and_then(|r| r.failed_seq);
        for a in &page.attempts {
            let stage = a.stage.as_str();
            for (output, digest) in a.canonical_digests.iter().flatten() {
                let stored = artifacts.get(&(stage, output.as_str()));
                if stored != Some(&digest.as_str()) {
                    self.push(
                        CANONICAL,
                        stage,
                        format!(
                            "attempt {} reported canonical `{output}` {digest}, but the store holds {stored:?}",
                            a.attempt
                        ),
                    );
                }
            }
            for (input, digest) in a.input_digests.iter().flatten() {
                let canonical = bindings.get(&(stage, input.as_str())).copied().flatten();
                if canonical != Some(digest.as_str()) {
                    self.push(
                        CANONICAL,
                        stage,
                        format!(
                            "attempt {} consumed input `{input}` with digest {digest}, but the canonical artifact is {canonical:?}",
                            a.attempt
                        ),
                    );
                }
            }
            // A PostgreSQL claim counts the satisfied edges it sees; only
            // that proves each predecessor committed first (ADR 0018).
            let total = incoming.get(stage).map_or(0, |i| i.total);
            if let Some(seen) = a.deps_seen.filter(|&seen| seen != total) {
                self.push(
                    DEPENDENCY,
                    stage,
                    format!(
                        "attempt {} was claimed when {seen} of its {total} dependencies had committed",
                        a.attempt
                    ),
                );
            }
            // A failed or cancelled run starts nothing after it ended.
            if let Some(failed_seq) = failed_seq.filter(|&f| a.claim_seq > f) {
                self.push(
                    CONTINUATION,
                    stage,
                    format!(
                        "attempt {} started (seq {}) after the run failed (seq {failed_seq})",
                        a.attempt, a.claim_seq
                    ),
                );
            }
        }
        for e in &page.early_starts {
            let when = e
                .from_succeeded_seq
                .map_or("never".to_string(), |s| format!("seq {s}"));
            self.push(
                DEPENDENCY,
                &e.stage,
                format!(
                    "attempt {} started (seq {}) before `{}` succeeded ({when})",
                    e.attempt, e.claim_seq, e.from_stage
                ),
            );
        }
    }

    /// Each job of the page against its attempts, outputs, outbox rows and
    /// incoming edges.
    fn check_jobs(
        &mut self,
        page: &StageAuditPage,
        artifacts: &HashMap<(&str, &str), &str>,
        incoming: &HashMap<&str, &IncomingEdges>,
    ) -> HashMap<String, i64> {
        // job id -> the attempt numbers that record success
        let mut successes: HashMap<i64, Vec<i64>> = HashMap::new();
        for a in page.attempts.iter().filter(|a| a.outcome == "succeeded") {
            successes.entry(a.job_id).or_default().push(a.attempt);
        }
        let outbox: HashSet<&str> = page.outbox.iter().map(|o| o.dedup_key.as_str()).collect();
        // stage -> the attempt that succeeded (or decided a rejected gate)
        let mut winners = HashMap::new();
        for job in &page.jobs {
            let (run, stage) = (job.run_id.as_str(), job.stage.as_str());
            if job.state != JobState::Succeeded && self.unfinished.is_none() {
                self.unfinished = Some((job.stage.clone(), job.state));
            }
            if job.state == JobState::Succeeded {
                match successes.get(&job.id).map(Vec::as_slice) {
                    Some([winner]) if *winner == job.attempt => {
                        winners.insert(job.stage.clone(), *winner);
                    }
                    Some([winner]) => self.push(
                        CONTINUATION,
                        stage,
                        format!(
                            "succeeded by attempt {winner}, but its last attempt is {}",
                            job.attempt
                        ),
                    ),
                    n => self.push(
                        CONTINUATION,
                        stage,
                        format!(
                            "succeeded, but {} attempts record success",
                            n.map_or(0, <[i64]>::len)
                        ),
                    ),
                }
                for output in &job.outputs {
                    if !artifacts.contains_key(&(stage, output.as_str())) {
                        self.push(
                            CANONICAL,
                            stage,
                            format!("succeeded without its output `{output}`"),
                        );
                    }
                }
                for event in &job.emits {
                    if !outbox.contains(outbox_dedup_key(run, stage, event).as_str()) {
                        self.push(
                            CONTINUATION,
                            stage,
                            format!("succeeded, but its `{event}` outbox row is missing"),
                        );
                    }
                }
            }
            if job.gate.is_some() && job.state == JobState::Dead {
                // A rejected gate: its deciding attempt stored the decision.
                winners.insert(job.stage.clone(), job.attempt);
            }
            if job.state == JobState::Awaiting && job.gate.is_none() {
                self.push(
                    CONTINUATION,
                    stage,
                    "awaits a decision, but it runs a plugin: no one will decide it".into(),
                );
            }
            let open = incoming.get(stage).map_or(0, |i| i.unsatisfied);
            let started = matches!(
                job.state,
                JobState::Ready | JobState::Running | JobState::Awaiting
            );
            if started && open > 0 {
                self.push(
                    DEPENDENCY,
                    stage,
                    format!(
                        "{}, but {open} incoming edges are unsatisfied",
                        job.state.as_str()
                    ),
                );
            }
            if job.state == JobState::Blocked && (open == 0 || job.pending != open) {
                self.push(
                    CONTINUATION,
                    stage,
                    format!(
                        "blocked with pending = {}, but {open} incoming edges are unsatisfied",
                        job.pending
                    ),
                );
            }
        }
        let jobs: HashMap<&str, &JobRow> =
            page.jobs.iter().map(|j| (j.stage.as_str(), j)).collect();
        for row in &page.outbox {
            let Some(job) = jobs.get(row.stage.as_str()) else {
                continue;
            };
            let wrong = if job.state != JobState::Succeeded {
                format!("the stage is {}", job.state.as_str())
            } else if !job.emits.contains(&row.event) {
                "the stage does not declare it".to_string()
            } else {
                continue;
            };
            let detail = format!("outbox event `{}` was written, but {wrong}", row.event);
            self.push(CONTINUATION, &row.stage, detail);
        }
        winners
    }

    /// The run's state against its stages', once every page was seen.
    fn finish(mut self) {
        let Some(state) = self.run.as_ref().map(|r| r.state) else {
            return;
        };
        match (self.unfinished.take(), state) {
            (None, RunState::Succeeded)
            | (Some(_), RunState::Running | RunState::Failed | RunState::Cancelled) => {}
            (None, state) => self.push(
                CONTINUATION,
                "-",
                format!("every stage succeeded, but the run is `{state}`"),
            ),
            (Some((stage, job_state)), state) => self.push(
                CONTINUATION,
                &stage,
                format!(
                    "the run is `{state}`, but this stage is {}",
                    job_state.as_str()
                ),
            ),
        }
        self.check_lifecycle(state);
        (self.progress)(self.report);
    }

    /// A finished run's last event says how it finished, written in the
    /// transaction that finished it; a running run has none, unless an
    /// operator retried it after it finished.
    fn check_lifecycle(&mut self, state: RunState) {
        let expected = match state {
            RunState::Succeeded => Some("run.succeeded"),
            RunState::Failed => Some("run.failed"),
            RunState::Cancelled => Some("run.cancelled"),
            RunState::Running => None,
        };
        let last = self.lifecycle.last().map(String::as_str);
        let fine = match expected {
            Some(_) => last == expected,
            None => last.is_none() || self.retried,
        };
        if !fine {
            let detail = format!(
                "the run is `{state}`, but its last lifecycle event is {}",
                last.map_or("missing".to_string(), |e| format!("`{e}`"))
            );
            self.push(CONTINUATION, "-", detail);
        }
    }
}

impl AuditVisitor for RunAudit<'_> {
    fn run(&mut self, facts: RunAuditFacts) {
        self.retried = facts.events.iter().any(|e| e.kind == "retry");
        self.run = Some(facts.run);
        self.lifecycle = facts.lifecycle.into_iter().map(|o| o.event).collect();
        self.report.runs += 1;
        for a in &facts.digest_mismatches {
            let detail = format!(
                "the stored bytes of `{}` no longer hash to its recorded digest {}",
                a.output, a.digest
            );
            self.push(CANONICAL, &a.stage, detail);
        }
        for a in &facts.orphan_artifacts {
            self.check_writer(a, None);
        }
    }

    fn stages(&mut self, page: StageAuditPage) {
        let mut artifacts: HashMap<(&str, &str), &str> = HashMap::new();
        for a in &page.artifacts {
            if artifacts
                .insert((a.stage.as_str(), a.output.as_str()), a.digest.as_str())
                .is_some()
            {
                self.push(
                    CANONICAL,
                    &a.stage,
                    format!("output `{}` stored more than once", a.output),
                );
            }
        }
        let incoming: HashMap<&str, &IncomingEdges> = page
            .incoming
            .iter()
            .map(|i| (i.stage.as_str(), i))
            .collect();
        self.check_attempts(&page, &artifacts, &incoming);
        let winners = self.check_jobs(&page, &artifacts, &incoming);
        for a in &page.artifacts {
            self.check_writer(a, winners.get(&a.stage).copied());
        }
        for edge in &page.lost_edges {
            self.push(
                CONTINUATION,
                &edge.from_stage,
                format!(
                    "succeeded, but its edge to `{}` was never satisfied",
                    edge.to_stage
                ),
            );
        }
        self.report.jobs += page.jobs.len();
        self.report.attempts += page.attempts.len();
        self.report.artifacts += page.artifacts.len();
        (self.progress)(self.report);
    }
}
