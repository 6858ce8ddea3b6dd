//! What an attempt produced and how it ended.

use std::collections::BTreeMap;

use crate::plugin::{ExecError, ExecReport, Payload};
use crate::store::{CanonicalOutput, ClaimedJob};

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    Succeeded {
        outputs: Vec<CanonicalOutput>,
        released: Vec<String>,
    },
    Retrying {
        at: i64,
        error: String,
    },
    Dead {
        error: String,
    },
    /// Fenced out: another attempt owns the job now; nothing was written.
    LeaseLost,
}

/// What `execute` produced, before anything is committed.
#[derive(Debug, Clone)]
pub struct Execution {
    /// Digest of the exact bytes handed to the plugin, per input.
    pub input_digests: BTreeMap<String, String>,
    pub result: Result<Vec<Payload>, ExecError>,
    pub report: ExecReport,
}

#[derive(Debug, Clone)]
pub struct Finished {
    pub job: ClaimedJob,
    pub outcome: AttemptOutcome,
    pub report: ExecReport,
}

pub(super) fn log_outcome(job: &ClaimedJob, outcome: &AttemptOutcome) {
    let (run, stage, attempt) = (job.run_id.as_str(), job.stage.as_str(), job.attempt);
    match outcome {
        AttemptOutcome::Succeeded { outputs, released } => {
            let lost = outputs.iter().filter(|o| !o.won).count();
            tracing::info!(
                run,
                stage,
                attempt,
                lost_proposals = lost,
                ?released,
                "stage succeeded"
            );
        }
        AttemptOutcome::Retrying { at, error } => {
            tracing::warn!(
                run,
                stage,
                attempt,
                retry_at = at,
                "attempt failed: {error}"
            );
        }
        AttemptOutcome::Dead { error } => {
            tracing::error!(run, stage, attempt, "stage dead: {error}")
        }
        AttemptOutcome::LeaseLost => {
            tracing::warn!(run, stage, attempt, "lease lost; result discarded")
        }
    }
}
