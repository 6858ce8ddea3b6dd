//! Test plugin: a retryable failure on attempts 1..=N, then success.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Flaky;

impl Stage for Flaky {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let failures: u32 = inputs.text("config")?.trim().parse().unwrap_or(0);
        if ctx.attempt() <= failures {
            return Err(Error::retryable(format!(
                "flaky failure on attempt {}",
                ctx.attempt()
            )));
        }
        Ok(Outputs::new().text("draft", format!("drafted on attempt {}", ctx.attempt())))
    }
}

export_stage!(Flaky);
