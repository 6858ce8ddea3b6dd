//! Test plugin: a Rust panic in the guest is a Wasm trap for the host.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Traps;

impl Stage for Traps {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        if ctx.attempt() == 1 {
            panic!("the guest panicked on attempt 1");
        }
        Ok(Outputs::new().text("draft", "survived a trap"))
    }
}

export_stage!(Traps);
