//! Hostile test plugin: a million log calls against a limit of a thousand.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct HostCallFlood;

impl Stage for HostCallFlood {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        for i in 0..1_000_000 {
            ctx.info(&format!("flood {i}"));
        }
        Ok(Outputs::new().text("draft", "flooded"))
    }
}

export_stage!(HostCallFlood);
