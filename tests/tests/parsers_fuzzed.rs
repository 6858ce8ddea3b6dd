//! Bad input, fuzzed in the normal suite: byte-level mutations of every
//! real manifest, pipeline and policy file this repository holds (and of a
//! real component, for `plugin add`) never panic a parser and always end
//! in one clear line: no line break and no control character in it.
//!
//! Seen failing before the fix (item 11 of #20): a stage name holding an
//! escaped newline (`name = "a\nb"`) gave a two-line error, the name quoted
//! as given; and a component whose import name held an ESC byte was
//! refused with wasmtime's message quoting it raw.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use proptest::prelude::*;
use ratchet_runtime::manifest::{Pipeline, PluginManifest};
use ratchet_runtime::plugin::{HostConfig, Policy};
use ratchet_tests::Harness;

/// Bytes that break documents in interesting ways.
const NASTY: &[u8] = b"\0\n\r\t\"'\\[]{}=.,#@^$~*-_ 0123456789aZ\x1b\x7f\xc3\xa9\xff";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn toml_files(dir: &Path, depth: usize, found: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && depth > 0 && !path.ends_with("target") {
            toml_files(&path, depth - 1, found);
        } else if path.extension().is_some_and(|e| e == "toml")
            && !path.ends_with("Cargo.toml")
            && let Ok(text) = std::fs::read_to_string(&path)
        {
            found.push(text);
        }
    }
}

/// Every manifest, pipeline and golden-file input in the repository, and a
/// policy.
static SEEDS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut seeds = Vec::new();
    toml_files(&root().join("tests/ui"), 1, &mut seeds);
    toml_files(&root().join("plugins"), 1, &mut seeds);
    seeds.push(
        "grants = [\"log\"]\n[caps]\ntimeout_ms = 1000\nmemory_mb = 64\n\
         max_output_bytes = 1024\nmax_host_calls = 10\n"
            .to_string(),
    );
    seeds.push("name = \"a\\nb\"\n[[stage]]\nname = \"x\\u001b[31m\"\nplugin = \"p@^1\"\n".into());
    assert!(seeds.len() > 30, "seed files found: {}", seeds.len());
    seeds
});

/// `seed` with each edit applied: insert, delete or replace one byte.
fn mutate(seed: &[u8], edits: &[(usize, u8, usize)]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for &(at, op, nasty) in edits {
        let at = if bytes.is_empty() {
            0
        } else {
            at % bytes.len()
        };
        let byte = NASTY[nasty % NASTY.len()];
        match op % 3 {
            0 => bytes.insert(at, byte),
            1 if !bytes.is_empty() => {
                bytes.remove(at);
            }
            _ if !bytes.is_empty() => bytes[at] = byte,
            _ => bytes.push(byte),
        }
    }
    bytes
}

fn one_clear_line(what: &str, text: &str, error: &impl ToString) -> Result<(), TestCaseError> {
    let message = error.to_string();
    prop_assert!(!message.is_empty(), "{what}: empty error for {text:?}");
    prop_assert!(
        !message.chars().any(char::is_control),
        "{what}: not one clean line: {message:?} for {text:?}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 3000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_documents_fail_in_one_clear_line(
        seed in 0..SEEDS.len(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<usize>()), 0..12),
    ) {
        let bytes = mutate(SEEDS[seed].as_bytes(), &edits);
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = PluginManifest::parse("plugin.toml", &text) {
            one_clear_line("manifest", &text, &e)?;
        }
        if let Err(e) = Pipeline::parse("pipeline.toml", &text) {
            one_clear_line("pipeline", &text, &e)?;
        }
        if let Err(e) = Policy::parse("policy.toml", &text) {
            one_clear_line("policy", &text, &e)?;
        }
    }
}

/// `plugin add`'s checks on byte-level mutations of a real component:
/// refused in one line, or admitted, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_components_are_refused_in_one_clear_line() {
    let h = Harness::with_host_config(HostConfig::default()).await;
    let real = std::fs::read(ratchet_tests::plugin_path("noop")).expect("noop component");
    // Seeded: each component compiles, and CI should meet the same 64.
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    // The case that found the raw ESC in a refusal (an import's name).
    let found = mutate(
        &real,
        &[(7_773_165_090_308_088_018, 8, 11_645_514_479_790_694_395)],
    );
    if let Err(e) = h.host.admit(&found).await {
        let message = e.to_string();
        assert!(!message.chars().any(char::is_control), "{message:?}");
    }
    let host = Arc::clone(&h.host);
    let handle = tokio::runtime::Handle::current();
    let strategy = proptest::collection::vec((any::<usize>(), any::<u8>(), any::<usize>()), 1..6);
    let outcome = tokio::task::spawn_blocking(move || {
        runner.run(&strategy, |edits| {
            let bytes = mutate(&real, &edits);
            if let Err(e) = handle.block_on(host.admit(&bytes)) {
                one_clear_line("component", "(bytes)", &e)?;
            }
            Ok(())
        })
    })
    .await
    .expect("the runner ran");
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
