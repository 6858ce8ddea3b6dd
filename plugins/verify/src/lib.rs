//! `verify`: reports the SHA-256 of the draft it was handed, and a verdict.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};
use sha2::{Digest, Sha256};

struct Verify;

impl Stage for Verify {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let draft = inputs.bytes("draft")?;
        let verdict = if draft.is_empty() { "empty" } else { "ok" };
        let report = serde_json::json!({
            "draft_sha256": hex::encode(Sha256::digest(draft)),
            "verdict": verdict,
            "length": draft.len(),
        });
        Outputs::new().json("report", &report)
    }
}

export_stage!(Verify);
