//! A pipeline: parsed and planned against a registry of every plugin name
//! it asks for (inputs `in`, `question` and `draft`, outputs `out` and
//! `text`), or refused in one clear line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratchet_fuzz::assert_one_clear_line;
use ratchet_runtime::manifest::{Pipeline, PluginManifest, PluginResolver, ResolvedPlugin};

struct AnyPlugin;

impl PluginResolver for AnyPlugin {
    fn resolve(&self, name: &str, _: &semver::VersionReq) -> Result<ResolvedPlugin, String> {
        let text = format!(
            "name = {name:?}\nversion = \"1.2.3\"\ninputs = [\"in\", \"question\", \"draft\"]\n\
             outputs = [\"out\", \"text\"]\n"
        );
        let manifest = PluginManifest::parse("registered", &text).map_err(|e| e.to_string())?;
        Ok(ResolvedPlugin {
            digest: format!("{name}-digest"),
            manifest,
        })
    }
}

fuzz_target!(|text: &str| {
    match Pipeline::parse("pipeline.toml", text) {
        Ok(pipeline) => {
            if let Err(e) = pipeline.plan(&AnyPlugin) {
                assert_one_clear_line("plan", &e.to_string());
            }
        }
        Err(e) => assert_one_clear_line("pipeline", &e.to_string()),
    }
});
