//! Hostile test plugin: spins forever; the host's deadline must end it.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct InfiniteLoop;

impl Stage for InfiniteLoop {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }
}

export_stage!(InfiniteLoop);
