//! The example plugins and demo pipeline, compiled to wasm32-wasip2 by the
//! build script and embedded so `ratchet demo` needs no files.

/// `(name, component bytes)` of every bundled plugin.
pub const PLUGINS: [(&str, &[u8]); 4] = [
    (
        "draft",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/draft.wasm")),
    ),
    (
        "verify",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/verify.wasm")),
    ),
    (
        "publish",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/publish.wasm")),
    ),
    (
        "prepare-next",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/prepare_next.wasm")),
    ),
];

/// The trivial stages `ratchet bench` runs: `pass` (input `in` to output
/// `out`), `noop` (no inputs, output `out`) and `split` (a text's
/// paragraphs, to map over).
pub const BENCH_PLUGINS: [(&str, &[u8]); 3] = [
    (
        "pass",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/pass.wasm")),
    ),
    (
        "noop",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/noop.wasm")),
    ),
    (
        "split",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/split.wasm")),
    ),
];

/// The map-reduce example's plugins (`ratchet demo --map-reduce`).
pub const MAP_REDUCE_PLUGINS: [(&str, &[u8]); 4] = [
    (
        "split",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/split.wasm")),
    ),
    (
        "summarise",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/summarise.wasm")),
    ),
    (
        "join",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/join.wasm")),
    ),
    (
        "publish",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/publish.wasm")),
    ),
];

/// The map-reduce example pipeline (`plugins/map-reduce.toml`).
pub const MAP_REDUCE_PIPELINE: &str = include_str!("../../plugins/map-reduce.toml");

/// The demo pipeline (`plugins/demo.toml`).
pub const DEMO_PIPELINE: &str = include_str!("../../plugins/demo.toml");

/// Where the build script left every compiled plugin (`NAME.wasm`, with `-`
/// written `_`), for tests that need the hostile ones too.
pub const PLUGIN_DIR: &str = concat!(env!("OUT_DIR"), "/plugins");
