//! Hostile test plugin: declares two outputs, returns one.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct MissingOutput;

impl Stage for MissingOutput {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new().text("draft", "only one"))
    }
}

export_stage!(MissingOutput);
