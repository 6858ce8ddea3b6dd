//! `draft`: asks the model for a one-paragraph announcement. Two attempts get
//! two different answers unless the host replays the journaled one.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Draft;

impl Stage for Draft {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let topic = match inputs.text("topic")?.trim() {
            "" => "the new release",
            topic => topic,
        };
        let answer = ctx.generate(&format!("Write a short announcement about {topic}."))?;
        ctx.info(&format!(
            "attempt {} drafted {} bytes",
            ctx.attempt(),
            answer.len()
        ));
        Ok(Outputs::new().text("draft", answer))
    }
}

export_stage!(Draft);
