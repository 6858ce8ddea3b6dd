//! Hostile test plugin: keeps allocating; the host's memory limit must stop it.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct MemoryBomb;

impl Stage for MemoryBomb {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![1u8; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
}

export_stage!(MemoryBomb);
