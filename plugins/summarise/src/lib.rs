//! `summarise`: asks the model for a one-sentence summary of one paragraph
//! (one element of the list it is mapped over, a JSON string).
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Summarise;

impl Stage for Summarise {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let part: String = inputs.json("part")?;
        let summary = ctx.generate(&format!("Summarise in one sentence: {part}"))?;
        Ok(Outputs::new().text("summary", summary.trim()))
    }
}

export_stage!(Summarise);
