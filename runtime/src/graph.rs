//! The words a pipeline's plan and the store share: the edges that make
//! happens-before durable, the bindings that say where an input comes
//! from, and the identities they name. Plain data; it depends on nothing
//! else in the crate, so the manifest parser and the store can both use it
//! without knowing of each other.

use serde::Serialize;

/// What an edge from one stage to another means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EdgeKind {
    // In the order of their names, which is how a plan lists two edges
    // between the same stages.
    /// Ordering only: the target runs after the source's effects committed.
    After,
    /// The target consumes an output of the source.
    Data,
}

impl EdgeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::Data => "data",
            EdgeKind::After => "after",
        }
    }
}

/// A happens-before edge of one run: `to_stage` starts only after
/// `from_stage` committed its success.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NewEdge {
    pub from_stage: String,
    pub to_stage: String,
    pub kind: EdgeKind,
}

/// Where one input of a stage is read from: the canonical artifact
/// `(from_stage, from_output)` of the same run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InputBinding {
    pub stage: String,
    pub input: String,
    pub from_stage: String,
    pub from_output: String,
}

/// A run's input (`$input` in a pipeline) is stored as the artifact
/// `(run, "$run", "input")`, so that every stage input, without exception,
/// is read from the run's artifacts.
pub const RUN_INPUT_STAGE: &str = "$run";
pub const RUN_INPUT_OUTPUT: &str = "input";

/// The dedup key of the outbox row a stage's success writes for `event`:
/// `RUN/STAGE/EVENT`, unique in the outbox, so a relay can deduplicate.
pub fn outbox_dedup_key(run_id: &str, stage: &str, event: &str) -> String {
    format!("{run_id}/{stage}/{event}")
}
