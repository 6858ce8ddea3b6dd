//! Unit tests of pipeline planning.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// Resolves `pass` and counts how often it was asked.
#[derive(Default)]
struct Counting(AtomicUsize);

impl PluginResolver for Counting {
    fn resolve(&self, name: &str, _: &semver::VersionReq) -> Result<ResolvedPlugin, String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let manifest = PluginManifest::parse(
            "pass manifest",
            &format!(
                "name = \"{name}\"\nversion = \"1.0.0\"\ninputs = [\"in\"]\noutputs = [\"out\"]\n"
            ),
        )
        .map_err(|e| e.to_string())?;
        Ok(ResolvedPlugin {
            digest: format!("{name}-digest"),
            manifest,
        })
    }
}

/// A fan-out names one plugin once per stage: each stage resolved (and
/// cloned) it again, a tenth of submitting a 500-stage run.
#[test]
fn stages_naming_the_same_plugin_share_one_resolution() {
    let mut text = String::from("name = \"fan\"\n");
    for i in 0..50 {
        text.push_str(&format!(
            "[[stage]]\nname = \"s{i}\"\nplugin = \"pass@^1\"\ninputs = {{ in = \"$input\" }}\n"
        ));
    }
    text.push_str(
        "[[stage]]\nname = \"t\"\nplugin = \"pass@=1.0.0\"\ninputs = { in = \"s0.out\" }\n",
    );
    let pipeline = Pipeline::parse("fan.toml", &text).expect("parse");
    let resolver = Counting::default();
    let plan = pipeline.plan(&resolver).expect("plan");
    assert_eq!(resolver.0.load(Ordering::SeqCst), 2, "once per reference");
    assert_eq!(plan.stages.len(), 51);
    let (PlannedWork::Plugin(first), PlannedWork::Plugin(last)) =
        (&plan.stages[0].work, &plan.stages[49].work)
    else {
        panic!("plugin stages");
    };
    assert!(Arc::ptr_eq(first, last));
    assert_eq!(plan.edges.len(), 1);
}
