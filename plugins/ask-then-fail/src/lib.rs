//! Test plugin: a model call, then a retryable failure on attempts 1..=N:
//! what a retry of a stage that died after paying for its answer replays.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct AskThenFail;

impl Stage for AskThenFail {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let failures: u32 = inputs.text("config")?.trim().parse().unwrap_or(0);
        let draft = inputs.text("draft")?;
        let review = ctx.generate(&format!("Review this announcement: {draft}"))?;
        if ctx.attempt() <= failures {
            return Err(Error::retryable(format!(
                "failed after the model answered, on attempt {}",
                ctx.attempt()
            )));
        }
        Ok(Outputs::new().text("review", review))
    }
}

export_stage!(AskThenFail);
