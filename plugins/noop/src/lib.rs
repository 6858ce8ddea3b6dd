//! Benchmark plugin: the cheapest possible stage, to measure the host.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Noop;

impl Stage for Noop {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_: &Context, _: &Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new().text("out", "ok"))
    }
}

export_stage!(Noop);
