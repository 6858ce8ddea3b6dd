//! What operators ask of a run ([`Intake::run_cancel`],
//! [`Intake::run_retry`]) and what came of it, and the caps they put on
//! attempts running at once.
//!
//! [`Intake::run_cancel`]: crate::store::Intake::run_cancel
//! [`Intake::run_retry`]: crate::store::Intake::run_retry

use serde::Serialize;

use super::{JobState, RunState};

/// Stop a running run: nothing new starts in it, an attempt in flight is
/// fenced out.
#[derive(Debug, Clone)]
pub struct RunCancel {
    pub run_id: String,
    pub reason: Option<String>,
    /// Who asked: recorded in the run's history.
    pub by: String,
    pub now: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The run is `cancelled`: `in_flight` attempts were fenced out,
    /// `waiting` stages will never start.
    Cancelled {
        in_flight: u64,
        waiting: u64,
    },
    NotFound,
    /// The run had already finished in this state; nothing was written.
    Finished {
        state: RunState,
    },
}

/// Resume a failed or cancelled run from the stages that did not succeed.
#[derive(Debug, Clone)]
pub struct RunRetry {
    pub run_id: String,
    /// The stage the operator retries from: it must exist and not have
    /// succeeded. Every stage that did not succeed resumes either way (the
    /// run cannot finish without them); it narrows `fresh` to this stage.
    pub stage: Option<String>,
    /// Discard the journaled model answers of the retried stages (of
    /// `stage` alone when given), so they ask the model again.
    pub fresh: bool,
    pub by: String,
    pub now: i64,
}

/// What a retry resumed: the run is `running` again in its next
/// `generation`; `stages` got a new budget of attempts;
/// `journal_discarded` model answers were dropped (`fresh`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Retried {
    pub generation: i64,
    pub stages: Vec<String>,
    pub journal_discarded: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryOutcome {
    Retried(Retried),
    NotFound,
    /// Only a failed or cancelled run is retried.
    NotRetryable {
        state: RunState,
    },
    /// `stage` is not a stage of the run.
    NoSuchStage,
    /// `stage` is in this state (`succeeded`): its artifacts are kept.
    StageNotRetryable {
        state: JobState,
    },
    /// The run failed because this approval gate was rejected: a decision
    /// is final.
    GateRejected {
        stage: String,
    },
    /// The run failed because this stage could not be mapped over its
    /// list (not an array, too long, outputs that cannot be joined): the
    /// list is canonical, so a retry would fail the same way.
    MapFailed {
        stage: String,
    },
}

/// At most `cap` attempts of the plugin named `plugin` (any version) run
/// at once, counted in the database at each claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginCap {
    pub plugin: String,
    pub cap: i64,
}
