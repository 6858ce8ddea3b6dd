//! Golden files for bad manifests, pipelines and sinks files: `ui/**/NAME.toml` must fail
//! with exactly the text in `ui/**/NAME.err`. `BLESS=1` rewrites the `.err`
//! files from the current output (review the diff before committing).

use std::path::Path;

use ratchet_runtime::manifest::{Pipeline, PluginManifest};
use ratchet_runtime::registry::RegistrySnapshot;
use ratchet_runtime::relay::Sinks;

fn demo_manifests() -> Vec<PluginManifest> {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
    ["draft", "verify", "publish", "prepare-next"]
        .iter()
        .map(|name| {
            let path = plugins.join(name).join("plugin.toml");
            let text = std::fs::read_to_string(&path).expect("manifest");
            PluginManifest::parse(&path.display().to_string(), &text).expect("valid demo manifest")
        })
        .collect()
}

fn check_dir(kind: &str, error_of: impl Fn(&str, &str) -> Option<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui").join(kind);
    let mut cases = 0;
    let mut failures = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("ui dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
    {
        cases += 1;
        let name = format!(
            "{kind}/{}",
            path.file_name().expect("name").to_string_lossy()
        );
        let text = std::fs::read_to_string(&path).expect("case");
        let Some(actual) = error_of(&name, &text) else {
            failures.push(format!("{name}: accepted, but it should be rejected"));
            continue;
        };
        let expected_path = path.with_extension("err");
        if std::env::var_os("BLESS").is_some() {
            std::fs::write(&expected_path, format!("{actual}\n")).expect("bless");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected.trim_end() != actual {
            failures.push(format!(
                "{name}:\n  expected: {}\n  actual:   {actual}",
                expected.trim_end()
            ));
        }
    }
    assert!(
        cases >= 5,
        "{kind}: too few cases found in {}",
        dir.display()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bad_pipelines_are_rejected_with_file_line_and_fix() {
    let registry = RegistrySnapshot::from_manifests(demo_manifests());
    check_dir("pipeline", |name, text| match Pipeline::parse(name, text) {
        Err(e) => Some(e.to_string()),
        Ok(p) => p.plan(&registry).err().map(|e| e.to_string()),
    });
}

#[test]
fn bad_plugin_manifests_are_rejected_with_file_line_and_fix() {
    check_dir("manifest", |name, text| {
        PluginManifest::parse(name, text)
            .err()
            .map(|e| e.to_string())
    });
}

#[test]
fn the_demo_pipeline_plans_into_durable_edges() {
    let registry = RegistrySnapshot::from_manifests(demo_manifests());
    let pipeline =
        Pipeline::parse("demo.toml", ratchet_runtime::bundled::DEMO_PIPELINE).expect("parse");
    let plan = pipeline.plan(&registry).expect("plan");
    let edges: Vec<String> = plan
        .edges
        .iter()
        .map(|e| format!("{}->{}:{}", e.from_stage, e.to_stage, e.kind.as_str()))
        .collect();
    assert_eq!(
        edges,
        [
            "draft->publish:data",
            "draft->verify:data",
            "publish->prepare-next:after",
            "publish->prepare-next:data",
        ]
    );
}

#[test]
fn bad_sinks_files_are_rejected_with_file_line_and_fix() {
    check_dir("sinks", |name, text| {
        Sinks::parse(name, text).err().map(|e| e.to_string())
    });
}
