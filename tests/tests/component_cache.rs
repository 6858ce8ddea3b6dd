//! Precompiled components on disk: a restarted worker loads them instead of
//! compiling, and a file that does not match the engine is recompiled, never
//! loaded and never an error.
//!
//! Checked on the buggy shape: with the engine hash left out of the file
//! name, the other-engine test fails.

use std::path::Path;

use ratchet_runtime::digest::sha256_hex;
use ratchet_runtime::plugin::{CompileStats, DiskCache, HostConfig};
use ratchet_tests::{Harness, plugin_path};

fn config(dir: &Path) -> HostConfig {
    HostConfig {
        cache_dir: Some(dir.to_path_buf()),
        ..HostConfig::default()
    }
}

/// A harness with `noop` registered through a host caching into `dir`.
async fn registered(dir: &Path) -> (Harness, String) {
    let h = Harness::with_host_config(config(dir)).await;
    h.register(&["noop"]).await;
    let digest = sha256_hex(&std::fs::read(plugin_path("noop")).expect("compiled plugin"));
    (h, digest)
}

/// A new worker process's host: same engine settings, empty memory.
fn restarted(h: &mut Harness, dir: &Path) {
    h.rehost(config(dir));
}

/// Runs one `noop` stage through the current host; it must succeed.
async fn assert_runs(h: &Harness) {
    let run = h
        .submit(&ratchet_tests::one_stage_pipeline("noop", "noop", ""), b"")
        .await;
    h.run_until_idle(1).await;
    assert_eq!(h.run_state(&run).await, "succeeded");
}

fn stats(compiled: u64, from_disk: u64) -> CompileStats {
    CompileStats {
        compiled,
        from_disk,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_loads_the_precompiled_component() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut h, digest) = registered(dir.path()).await;
    assert_eq!(h.host.compile_stats(), stats(1, 0));
    restarted(&mut h, dir.path());
    h.host.load(&digest).await.expect("load");
    assert_eq!(h.host.compile_stats(), stats(0, 1), "not recompiled");
    assert_runs(&h).await;
}

/// A file written by an engine with other settings, put where this engine
/// looks: wasmtime's own check refuses it and the host recompiles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_from_another_engine_configuration_is_recompiled() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut h, digest) = registered(dir.path()).await;
    let ours = h.host.disk_cache().expect("cache").path(&digest);

    let mut other_config = wasmtime::Config::new();
    other_config.epoch_interruption(false);
    let other = wasmtime::Engine::new(&other_config).expect("engine");
    let bytes = std::fs::read(plugin_path("noop")).expect("compiled plugin");
    let component = wasmtime::component::Component::new(&other, &bytes).expect("compile");
    let theirs = DiskCache::new(dir.path().to_path_buf(), &other);
    assert_ne!(
        theirs.path(&digest),
        ours,
        "engine settings are in the name"
    );
    theirs.store(&digest, &component).expect("write");
    std::fs::copy(theirs.path(&digest), &ours).expect("stale file in place");

    restarted(&mut h, dir.path());
    h.host.load(&digest).await.expect("recompiled, not failed");
    assert_eq!(h.host.compile_stats(), stats(1, 0));
    assert_runs(&h).await;
    restarted(&mut h, dir.path());
    h.host.load(&digest).await.expect("load");
    assert_eq!(h.host.compile_stats(), stats(0, 1), "the file was replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_file_is_recompiled() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut h, digest) = registered(dir.path()).await;
    let path = h.host.disk_cache().expect("cache").path(&digest);
    let file = std::fs::read(&path).expect("precompiled file");
    std::fs::write(&path, &file[..file.len() / 2]).expect("tear it");
    restarted(&mut h, dir.path());
    h.host.load(&digest).await.expect("recompiled, not failed");
    assert_eq!(h.host.compile_stats(), stats(1, 0));
    assert_runs(&h).await;
}
