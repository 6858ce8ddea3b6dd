//! Test plugin: the prompt depends on the attempt number, which a journaled
//! replay must refuse; attempt 1 fails after its model call.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct NondeterministicPrompt;

impl Stage for NondeterministicPrompt {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        let answer = ctx.generate(&format!("attempt {} wants a fresh answer", ctx.attempt()))?;
        if ctx.attempt() == 1 {
            return Err(Error::retryable("failing after the model call"));
        }
        Ok(Outputs::new().text("draft", answer))
    }
}

export_stage!(NondeterministicPrompt);
