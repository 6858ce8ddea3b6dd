//! Test plugin: `draft` 3.0.0 renames its output.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct DraftV3;

impl Stage for DraftV3 {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new().text("text", inputs.text("topic")?))
    }
}

export_stage!(DraftV3);
