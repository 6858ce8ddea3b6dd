//! What a stage's job does and the states it goes through: a plugin, an
//! approval gate (what it waits for, [`Intake::gate_decide`], and what came
//! of a decision) or a map over a list.
//!
//! [`Intake::gate_decide`]: crate::store::Intake::gate_decide

use serde::{Deserialize, Serialize};

/// The one output of every gate: its decision, as a canonical artifact.
pub const GATE_OUTPUT: &str = "decision";

/// Job states; see docs/job-states.md for the diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Blocked,
    Ready,
    Running,
    /// An approval gate waiting for an operator's decision: never claimed.
    Awaiting,
    /// A stage that maps over a list, released: expanded into its elements'
    /// jobs, or joined, before the transaction that released it commits.
    Mapping,
    Succeeded,
    Failed,
    Dead,
    Cancelled,
}

impl JobState {
    /// Every state. A run has succeeded when every job is `Succeeded`;
    /// PostgreSQL's `ratchet_finish_runs` (migration 0006) lists the others
    /// by name, pinned to this list by `tests/tests/postgres_functions.rs`.
    pub const ALL: [JobState; 9] = [
        JobState::Blocked,
        JobState::Ready,
        JobState::Running,
        JobState::Awaiting,
        JobState::Mapping,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Dead,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Blocked => "blocked",
            JobState::Ready => "ready",
            JobState::Running => "running",
            JobState::Awaiting => "awaiting",
            JobState::Mapping => "mapping",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "blocked" => JobState::Blocked,
            "ready" => JobState::Ready,
            "running" => JobState::Running,
            "awaiting" => JobState::Awaiting,
            "mapping" => JobState::Mapping,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            "dead" => JobState::Dead,
            "cancelled" => JobState::Cancelled,
            _ => return None,
        })
    }
}

/// What a stage's job does when it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageWork {
    /// Runs the plugin of this digest.
    Plugin(String),
    /// Waits for an operator's decision.
    Gate(GateSpec),
}

impl StageWork {
    pub fn plugin_digest(&self) -> Option<&str> {
        match self {
            StageWork::Plugin(digest) => Some(digest),
            StageWork::Gate(_) => None,
        }
    }

    pub fn gate(&self) -> Option<&GateSpec> {
        match self {
            StageWork::Plugin(_) => None,
            StageWork::Gate(gate) => Some(gate),
        }
    }
}

/// A stage mapped over a list: one job per element of `stage.output`, a
/// JSON array of at most `cap` elements (`store::map`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSpec {
    pub stage: String,
    pub output: String,
    pub cap: i64,
}

/// An approval gate as its pipeline declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSpec {
    /// What the approver is asked to check.
    pub question: String,
    /// Rejects itself this long after it began to await a decision.
    pub timeout_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Approved,
    Rejected,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Approved => "approved",
            Verdict::Rejected => "rejected",
        }
    }
}

/// A gate's decision: the bytes of its canonical artifact
/// ([`GATE_OUTPUT`]), which downstream stages consume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Decision {
    pub decision: Verdict,
    /// Who decided: an operator's name, or `timeout` when the gate's
    /// timeout passed first.
    pub by: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Decide an awaiting gate.
#[derive(Debug, Clone)]
pub struct GateDecide {
    pub run_id: String,
    pub stage: String,
    pub decision: Decision,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateOutcome {
    /// This decision is the gate's canonical artifact; an approval
    /// released the stages after it, a rejection failed the run.
    Decided,
    /// Another decision won; this is it. Nothing was written.
    AlreadyDecided(Decision),
    NotFound,
    NoSuchStage,
    /// The stage runs a plugin.
    NotAGate,
    /// The gate is not awaiting a decision: blocked on its upstream
    /// stages, or its run ended without one. Nothing was written.
    NotAwaiting {
        state: JobState,
    },
}

/// An awaiting gate whose timeout has passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredGate {
    pub run_id: String,
    pub stage: String,
    pub timeout_ms: i64,
}
