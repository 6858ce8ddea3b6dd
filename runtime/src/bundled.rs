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
/// `out`) and `noop` (no inputs, output `out`).
pub const BENCH_PLUGINS: [(&str, &[u8]); 2] = [
    (
        "pass",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/pass.wasm")),
    ),
    (
        "noop",
        include_bytes!(concat!(env!("OUT_DIR"), "/plugins/noop.wasm")),
    ),
];

/// The demo pipeline (`plugins/demo.toml`).
pub const DEMO_PIPELINE: &str = include_str!("../../plugins/demo.toml");

/// Where the build script left every compiled plugin (`NAME.wasm`, with `-`
/// written `_`), for tests that need the hostile ones too.
pub const PLUGIN_DIR: &str = concat!(env!("OUT_DIR"), "/plugins");
