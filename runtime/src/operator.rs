//! What an operator does to a run, with the refusals told in one line each:
//! cancel it, retry it from the stages that did not succeed
//! (docs/job-states.md), decide its approval gates (docs/gates.md).

use crate::clock::Clock;
use crate::registry::RegistryError;
pub use crate::store::Retried;
use crate::store::{
    CancelOutcome, Decision, GateDecide, GateOutcome, Intake, JobState, RetryOutcome, RunCancel,
    RunRetry, RunState, Verdict,
};

/// Who runs the command, as the OS tells: the default of `--by`.
pub fn os_user() -> String {
    ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown".to_string())
}

/// Cancels a running run; returns how many attempts were fenced out and how
/// many stages will never start.
pub async fn run_cancel(
    store: &(impl Intake + ?Sized),
    run_id: &str,
    reason: Option<String>,
    by: String,
    clock: &dyn Clock,
) -> Result<(u64, u64), RegistryError> {
    let outcome = store
        .run_cancel(RunCancel {
            run_id: run_id.to_string(),
            reason,
            by,
            now: clock.now_ms(),
        })
        .await?;
    match outcome {
        CancelOutcome::Cancelled { in_flight, waiting } => Ok((in_flight, waiting)),
        CancelOutcome::NotFound => Err(no_run(run_id)),
        CancelOutcome::Finished { state } => Err(RegistryError::Refused(format!(
            "run `{run_id}` has already {state}; only a running run can be cancelled"
        ))),
    }
}

/// Retries a failed or cancelled run from the stages that did not succeed;
/// `stage` names the one to retry from (and narrows `fresh` to it).
pub async fn run_retry(
    store: &(impl Intake + ?Sized),
    run_id: &str,
    stage: Option<String>,
    fresh: bool,
    by: String,
    clock: &dyn Clock,
) -> Result<Retried, RegistryError> {
    let named = stage.clone().unwrap_or_default();
    let outcome = store
        .run_retry(RunRetry {
            run_id: run_id.to_string(),
            stage,
            fresh,
            by,
            now: clock.now_ms(),
        })
        .await?;
    let refused = |m: String| Err(RegistryError::Refused(m));
    match outcome {
        RetryOutcome::Retried(retried) => Ok(retried),
        RetryOutcome::NotFound => Err(no_run(run_id)),
        RetryOutcome::NotRetryable {
            state: RunState::Running,
        } => refused(format!(
            "run `{run_id}` is still running; cancel it first (`ratchet cancel {run_id}`) to retry it"
        )),
        RetryOutcome::NotRetryable { state } => refused(format!(
            "run `{run_id}` {state}; only a failed or cancelled run can be retried"
        )),
        RetryOutcome::NoSuchStage => refused(format!(
            "run `{run_id}` has no stage `{named}` (`ratchet status {run_id}` lists them)"
        )),
        RetryOutcome::GateRejected { stage } => refused(format!(
            "run `{run_id}` failed because gate `{stage}` was rejected, and a decision is final; submit a new run to ask again"
        )),
        RetryOutcome::MapFailed { stage } => refused(format!(
            "run `{run_id}` failed because stage `{stage}` could not be mapped over its list (`ratchet status {run_id}` says why); the list is canonical, so a retry would fail the same way: submit a new run"
        )),
        RetryOutcome::StageNotRetryable { state } => refused(format!(
            "stage `{named}` of run `{run_id}` is {}: its artifacts are kept and it does not run again; name a stage that did not succeed",
            state.as_str()
        )),
    }
}

/// Decides the approval gate `stage` of a run; returns the decision
/// recorded. A gate another decision reached first is refused with that
/// decision: who, which, and their note.
pub async fn gate_decide(
    store: &(impl Intake + ?Sized),
    run_id: &str,
    stage: &str,
    decision: Verdict,
    by: String,
    note: Option<String>,
    clock: &dyn Clock,
) -> Result<Decision, RegistryError> {
    let decision = Decision {
        decision,
        by,
        at_ms: clock.now_ms(),
        note,
    };
    let outcome = store
        .gate_decide(GateDecide {
            run_id: run_id.to_string(),
            stage: stage.to_string(),
            decision: decision.clone(),
        })
        .await?;
    let refused = |m: String| Err(RegistryError::Refused(m));
    match outcome {
        GateOutcome::Decided => Ok(decision),
        GateOutcome::AlreadyDecided(won) => {
            let note = won.note.map_or(String::new(), |n| format!(" ({n})"));
            refused(format!(
                "gate `{stage}` of run `{run_id}` was already {} by {}{note}; this decision was not recorded",
                won.decision.as_str(),
                won.by
            ))
        }
        GateOutcome::NotFound => Err(no_run(run_id)),
        GateOutcome::NoSuchStage => refused(format!(
            "run `{run_id}` has no stage `{stage}` (`ratchet status {run_id}` lists them)"
        )),
        GateOutcome::NotAGate => refused(format!(
            "stage `{stage}` of run `{run_id}` runs a plugin; only an approval gate (`approve = ...` in the pipeline) takes a decision"
        )),
        GateOutcome::NotAwaiting {
            state: JobState::Blocked,
        } => refused(format!(
            "gate `{stage}` of run `{run_id}` is not awaiting a decision yet: the stages before it have not all succeeded"
        )),
        GateOutcome::NotAwaiting { state } => refused(format!(
            "gate `{stage}` of run `{run_id}` is {} without a decision: its run ended first",
            state.as_str()
        )),
    }
}

fn no_run(run_id: &str) -> RegistryError {
    RegistryError::NotFound(format!(
        "no run `{run_id}` in this database (`ratchet status` lists the runs)"
    ))
}
