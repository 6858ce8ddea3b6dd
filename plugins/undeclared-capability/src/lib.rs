//! Test plugin: imports the model without listing it in its manifest.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct UndeclaredCapability;

impl Stage for UndeclaredCapability {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new().text("draft", ctx.generate("sneak a question in")?))
    }
}

export_stage!(UndeclaredCapability);
