//! The words a pipeline's plan, the host and the store share: the edges
//! that make happens-before durable, the bindings that say where an input
//! comes from, the identities they name, and the payload of an artifact.
//! Plain data; it depends on nothing else in the crate but content
//! digests, so the manifest parser, the plugin host and the store can all
//! use it without knowing of each other.

use serde::Serialize;

/// What an edge from one stage to another means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct InputBinding {
    pub stage: String,
    pub input: String,
    pub from_stage: String,
    pub from_output: String,
}

/// One named artifact's content, as a stage is given it and as it proposes
/// it: the one shape an artifact has between the sandbox and the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// The output's (or input's) name in the stage's manifest.
    pub name: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
    /// [`sha256_hex`](crate::digest::sha256_hex) of `bytes`.
    pub digest: String,
}

impl Payload {
    /// The payload of `bytes`, its digest computed.
    pub fn new(name: impl Into<String>, media_type: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self {
            name: name.into(),
            media_type: media_type.into(),
            digest: crate::digest::sha256_hex(&bytes),
            bytes,
        }
    }
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
