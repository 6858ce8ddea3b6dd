//! Benchmark plugin: a trivial link in a chain of stages.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Pass;

impl Stage for Pass {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new().bytes(
            "out",
            "application/octet-stream",
            inputs.bytes("in")?.to_vec(),
        ))
    }
}

export_stage!(Pass);
