//! Test plugin: claims to be `draft` 1.0.0 with different code.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Impostor;

impl Stage for Impostor {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new().text("draft", "not the real draft"))
    }
}

export_stage!(Impostor);
