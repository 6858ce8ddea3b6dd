//! What operators do to a run: cancel it, retry it from the stages that did
//! not succeed. The order of the steps is decided here once; each backend
//! supplies the statements ([`ControlTx`]) in its own folder.
//!
//! Rows are locked the run's jobs first, in id order, then the run, as
//! completions and failures lock them (`store::complete`, `store::fail`):
//! a completion that holds its job makes a cancel wait for its commit, and
//! a cancel that holds the jobs fences out every completion after it. Two
//! operators (a cancel and a retry) queue on the run's first job.

use super::rows::corrupt;
use super::{
    CancelOutcome, JobState, Result, Retried, RetryOutcome, RunCancel, RunRetry, RunState,
};

/// A job of the run as a control step sees it, its row locked.
struct ControlledJob {
    stage: String,
    state: JobState,
    is_gate: bool,
    is_map: bool,
}

/// The statements of a cancel or a retry, inside one open transaction.
pub(crate) trait ControlTx {
    /// Every job of the run as `(stage, state, is a gate, maps over a
    /// list)`, rows locked in id order where the backend locks rows.
    async fn jobs_lock(&mut self, run_id: &str) -> Result<Vec<(String, String, bool, bool)>>;
    /// The run's state, its row locked likewise.
    async fn run_lock(&mut self, run_id: &str) -> Result<Option<String>>;
    /// The running attempts of the run's running jobs ended `cancelled`
    /// with `error`.
    async fn attempts_cancel(&mut self, run_id: &str, error: &str, now: i64) -> Result<()>;
    /// The run's blocked, ready and running jobs cancelled, leases
    /// released.
    async fn jobs_cancel(&mut self, run_id: &str, now: i64) -> Result<()>;
    /// The run `cancelled`, with a new value of the order shared by claims
    /// and completions as its `failed_seq` (no claim commits after it), and
    /// its `run.cancelled` lifecycle event.
    async fn run_cancel(&mut self, run_id: &str, now: i64) -> Result<()>;
    /// Each dead or cancelled job of the run waits again: its limit raised
    /// by one budget of attempts past the attempts it made, `pending`
    /// counted afresh from its unsatisfied edges, released (due now) when
    /// there are none, else `blocked`. Returns each `(stage, state)`.
    async fn jobs_resume(&mut self, run_id: &str, now: i64) -> Result<Vec<(String, String)>>;
    /// Expands or joins these stages, which map over a list (`store::map`).
    async fn maps_advance(&mut self, run_id: &str, stages: Vec<String>, now: i64) -> Result<()>;
    /// Drops the journaled model answers of these stages; returns how many.
    async fn journal_discard(&mut self, run_id: &str, stages: &[String]) -> Result<u64>;
    /// The run `running` again in its next generation; returns it.
    async fn run_resume(&mut self, run_id: &str) -> Result<i64>;
    /// A line in the run's history.
    async fn history_record(
        &mut self,
        run_id: &str,
        stage: Option<&str>,
        kind: &str,
        detail: &str,
        now: i64,
    ) -> Result<()>;
}

/// The error recorded on an attempt fenced out by a cancel.
fn cancelled_in_flight(reason: Option<&str>) -> String {
    let why = reason.map_or(String::new(), |r| format!(": {r}"));
    format!("the run was cancelled while this attempt ran{why}; its result is discarded")
}

/// Cancels (see [`super::Intake::run_cancel`]). The caller commits on
/// [`CancelOutcome::Cancelled`]; otherwise nothing was written.
pub(crate) async fn cancel(tx: &mut impl ControlTx, c: &RunCancel) -> Result<CancelOutcome> {
    let jobs = locked_jobs(tx, &c.run_id).await?;
    match locked_run(tx, &c.run_id).await? {
        None => return Ok(CancelOutcome::NotFound),
        Some(RunState::Running) => {}
        Some(state) => return Ok(CancelOutcome::Finished { state }),
    }
    let count = |states: &[JobState]| jobs.iter().filter(|j| states.contains(&j.state)).count();
    let in_flight = count(&[JobState::Running]) as u64;
    let waiting = count(&[JobState::Blocked, JobState::Ready, JobState::Awaiting]) as u64;
    let error = cancelled_in_flight(c.reason.as_deref());
    tx.attempts_cancel(&c.run_id, &error, c.now).await?;
    tx.jobs_cancel(&c.run_id, c.now).await?;
    tx.run_cancel(&c.run_id, c.now).await?;
    let why = c
        .reason
        .as_deref()
        .map_or(String::new(), |r| format!(": {r}"));
    let detail = format!(
        "cancelled by {}{why} ({in_flight} attempt(s) in flight fenced out, {waiting} stage(s) never started)",
        c.by
    );
    tx.history_record(&c.run_id, None, "cancel", &detail, c.now)
        .await?;
    Ok(CancelOutcome::Cancelled { in_flight, waiting })
}

/// Retries (see [`super::Intake::run_retry`]). The caller commits on
/// [`RetryOutcome::Retried`]; otherwise nothing was written.
pub(crate) async fn retry(tx: &mut impl ControlTx, r: &RunRetry) -> Result<RetryOutcome> {
    let jobs = locked_jobs(tx, &r.run_id).await?;
    match locked_run(tx, &r.run_id).await? {
        None => return Ok(RetryOutcome::NotFound),
        Some(RunState::Failed | RunState::Cancelled) => {}
        Some(state) => return Ok(RetryOutcome::NotRetryable { state }),
    }
    if let Some(stage) = &r.stage {
        match jobs.iter().find(|j| &j.stage == stage) {
            None => return Ok(RetryOutcome::NoSuchStage),
            Some(j) if j.state == JobState::Succeeded => {
                return Ok(RetryOutcome::StageNotRetryable { state: j.state });
            }
            Some(_) => {}
        }
    }
    // A decision is the gate's canonical artifact: a rejected gate stays
    // rejected, and so does its run.
    if let Some(gate) = jobs.iter().find(|j| j.is_gate && j.state == JobState::Dead) {
        return Ok(RetryOutcome::GateRejected {
            stage: gate.stage.clone(),
        });
    }
    if let Some(map) = jobs.iter().find(|j| j.is_map && j.state == JobState::Dead) {
        return Ok(RetryOutcome::MapFailed {
            stage: map.stage.clone(),
        });
    }
    let resumed = tx.jobs_resume(&r.run_id, r.now).await?;
    let mapping = resumed
        .iter()
        .filter(|(_, state)| state == JobState::Mapping.as_str())
        .map(|(stage, _)| stage.clone())
        .collect();
    let mut stages: Vec<String> = resumed.into_iter().map(|(stage, _)| stage).collect();
    stages.sort();
    let journal_discarded = match (&r.stage, r.fresh) {
        (_, false) => 0,
        (Some(stage), true) => {
            tx.journal_discard(&r.run_id, std::slice::from_ref(stage))
                .await?
        }
        (None, true) => tx.journal_discard(&r.run_id, &stages).await?,
    };
    let generation = tx.run_resume(&r.run_id).await?;
    tx.maps_advance(&r.run_id, mapping, r.now).await?;
    let from = r
        .stage
        .as_deref()
        .map_or(String::new(), |s| format!(" from `{s}`"));
    let fresh = if r.fresh {
        format!(", {journal_discarded} journaled model answer(s) discarded")
    } else {
        String::new()
    };
    let detail = format!(
        "retried by {}{from} as generation {generation}: {} resumed{fresh}",
        r.by,
        stages.join(", ")
    );
    tx.history_record(&r.run_id, r.stage.as_deref(), "retry", &detail, r.now)
        .await?;
    Ok(RetryOutcome::Retried(Retried {
        generation,
        stages,
        journal_discarded,
    }))
}

async fn locked_jobs(tx: &mut impl ControlTx, run_id: &str) -> Result<Vec<ControlledJob>> {
    let rows = tx.jobs_lock(run_id).await?;
    rows.into_iter()
        .map(|(stage, state, is_gate, is_map)| {
            let state = JobState::parse(&state)
                .ok_or_else(|| corrupt("jobs", format!("unknown job state `{state}`")))?;
            Ok(ControlledJob {
                stage,
                state,
                is_gate,
                is_map,
            })
        })
        .collect()
}

async fn locked_run(tx: &mut impl ControlTx, run_id: &str) -> Result<Option<RunState>> {
    let Some(state) = tx.run_lock(run_id).await? else {
        return Ok(None);
    };
    let parsed = RunState::parse(&state)
        .ok_or_else(|| corrupt("runs", format!("unknown state `{state}`")))?;
    Ok(Some(parsed))
}

/// Runs `op` again while the database reports a transient failure (a
/// deadlock victim, a dropped connection), up to a few times: an operator's
/// command should not fail because a worker's batch held a lock it needed.
pub(crate) async fn with_retries<T, F>(mut op: impl FnMut() -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(e) if e.is_transient() && tries < 4 => tries += 1,
            other => return other,
        }
    }
}
