//! `prepare-next`: ordered after `publish`; copies the published digest.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

#[derive(serde::Deserialize)]
struct Receipt {
    draft_sha256: String,
}

struct PrepareNext;

impl Stage for PrepareNext {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let receipt: Receipt = inputs.json("receipt")?;
        let next = serde_json::json!({ "published_sha256": receipt.draft_sha256 });
        Outputs::new().json("next", &next)
    }
}

export_stage!(PrepareNext);
