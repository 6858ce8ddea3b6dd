//! Test plugin: `draft` 2.0.0 — marks its drafts so tests can tell versions apart.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct DraftV2;

impl Stage for DraftV2 {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let topic = inputs.text("topic")?;
        let answer = ctx.generate(&format!("Write a short announcement about {topic}."))?;
        Ok(Outputs::new().text("draft", format!("v2: {answer}")))
    }
}

export_stage!(DraftV2);
