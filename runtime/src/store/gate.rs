//! Deciding an approval gate: the order of the steps is decided here once;
//! each backend supplies the statements ([`GateTx`]) in its own folder.
//!
//! A decision is the gate's next attempt, taken and finished in one
//! transaction: the gate's job row is locked first (as a completion locks
//! its job), so of two racing decisions the second finds the job no longer
//! `awaiting` and reads the first's artifact back. The decision is stored
//! canonical-first as the gate's one output ([`GATE_OUTPUT`]). It is a host
//! attempt (`store::host`): an approval then succeeds the job and releases
//! its dependents exactly as a completion does (expanding any map it
//! releases), and a rejection kills the job and fails the run exactly as a
//! failed last attempt does.

use std::collections::BTreeMap;

use super::host::HostAttempt;
use super::map::{self, MapTx};
use super::rows::corrupt;
use super::{Decision, GATE_OUTPUT, GateDecide, GateOutcome, JobState, Payload, Result, Verdict};

/// A stage's job as a decision sees it, its row locked.
pub(crate) struct GateJob {
    pub job_id: i64,
    pub state: String,
    pub is_gate: bool,
    pub attempt: i64,
}

/// The statements of a decision, inside one open transaction, beside
/// those of any host attempt (`store::host`) and of maps (`store::map`),
/// which an approval may release.
pub(crate) trait GateTx: MapTx {
    /// The stage's job, its row locked where the backend locks rows.
    async fn gate_lock(&mut self, run_id: &str, stage: &str) -> Result<Option<GateJob>>;
    /// Whether the run exists.
    async fn run_exists(&mut self, run_id: &str) -> Result<bool>;
    /// Input name -> digest of the canonical artifact each of the stage's
    /// inputs is bound to (what the approver was shown).
    async fn input_digests(
        &mut self,
        run_id: &str,
        stage: &str,
    ) -> Result<BTreeMap<String, String>>;
    /// The stored decision's bytes, if there is one.
    async fn decision_read(&mut self, run_id: &str, stage: &str) -> Result<Option<Vec<u8>>>;
}

/// The lease owner (and attempt worker) of a decision by `by`.
pub(crate) fn decider(by: &str) -> String {
    format!("decision:{by}")
}

/// Decides (see [`super::Intake::gate_decide`]). The caller commits on
/// [`GateOutcome::Decided`]; otherwise nothing was written.
pub(crate) async fn decide(tx: &mut impl GateTx, d: &GateDecide) -> Result<GateOutcome> {
    let Some(job) = tx.gate_lock(&d.run_id, &d.stage).await? else {
        return Ok(if tx.run_exists(&d.run_id).await? {
            GateOutcome::NoSuchStage
        } else {
            GateOutcome::NotFound
        });
    };
    if !job.is_gate {
        return Ok(GateOutcome::NotAGate);
    }
    let state = JobState::parse(&job.state)
        .ok_or_else(|| corrupt("jobs", format!("unknown job state `{}`", job.state)))?;
    if state != JobState::Awaiting {
        return Ok(match stored_decision(tx, d).await? {
            Some(won) => GateOutcome::AlreadyDecided(won),
            None => GateOutcome::NotAwaiting { state },
        });
    }
    let worker = decider(&d.decision.by);
    let host = HostAttempt {
        job_id: job.job_id,
        attempt: job.attempt + 1,
        run_id: &d.run_id,
        stage: &d.stage,
        worker: &worker,
        now: d.decision.at_ms,
    };
    let inputs = tx.input_digests(&d.run_id, &d.stage).await?;
    host.take(tx).await?;
    let bytes = serde_json::to_vec(&d.decision).expect("a decision serializes");
    let stored = host
        .put(tx, &Payload::new(GATE_OUTPUT, "application/json", bytes))
        .await?;
    if !stored.inserted {
        // An awaiting gate has no decision: a retry never resumes a
        // decided gate (`store::control`).
        return Err(corrupt(
            "artifacts",
            format!("gate `{}` awaited a decision but has one", d.stage),
        ));
    }
    match d.decision.decision {
        Verdict::Approved => {
            let outputs = BTreeMap::from([(GATE_OUTPUT.to_string(), stored.digest)]);
            let released = host.succeed(tx, &outputs, &inputs).await?;
            map::advance(tx, released, host.now).await?;
        }
        Verdict::Rejected => {
            host.fail(tx, rejected_error(&d.decision), inputs).await?;
        }
    }
    Ok(GateOutcome::Decided)
}

/// The error a rejected gate's job and run record.
pub(crate) fn rejected_error(d: &Decision) -> String {
    let note = d
        .note
        .as_deref()
        .map_or(String::new(), |n| format!(": {n}"));
    format!("rejected by {}{note}", d.by)
}

async fn stored_decision(tx: &mut impl GateTx, d: &GateDecide) -> Result<Option<Decision>> {
    let Some(bytes) = tx.decision_read(&d.run_id, &d.stage).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| corrupt("artifacts", format!("gate `{}` decision: {e}", d.stage)))
}
