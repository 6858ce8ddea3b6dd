//! Hostile test plugin: a 4 MiB output against a 64 KiB limit.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct GiantOutput;

impl Stage for GiantOutput {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new().bytes("draft", "application/octet-stream", vec![7u8; 4 << 20]))
    }
}

export_stage!(GiantOutput);
