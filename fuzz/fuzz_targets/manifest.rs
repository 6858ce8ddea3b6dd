//! A plugin's manifest (what `describe` returns, and `plugin.toml`): parsed,
//! or refused in one clear line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratchet_fuzz::assert_one_clear_line;
use ratchet_runtime::manifest::PluginManifest;

fuzz_target!(|text: &str| {
    if let Err(e) = PluginManifest::parse("plugin.toml", text) {
        assert_one_clear_line("manifest", &e.to_string());
    }
});
