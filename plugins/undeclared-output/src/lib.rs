//! Hostile test plugin: an extra, undeclared output.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct UndeclaredOutput;

impl Stage for UndeclaredOutput {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new()
            .text("draft", "fine")
            .text("secret", "smuggled"))
    }
}

export_stage!(UndeclaredOutput);
