//! Test plugin: a fatal error, every time.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct AlwaysFatal;

impl Stage for AlwaysFatal {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        Err(Error::fatal("this input can never be processed"))
    }
}

export_stage!(AlwaysFatal);
