//! Hostile plugins: each does one thing an untrusted stage can do (loop
//! forever, eat memory, flood the host, return too much or the wrong
//! outputs, try to escape the sandbox). Each test runs it beside a normal
//! demo run; the host ends the hostile attempt with a recorded reason and
//! finishes the other run.

use ratchet_runtime::store::JobState;
use ratchet_tests::{DEMO_PLUGINS, Harness};
use serde_json::Value;

/// Runs `plugin` as a one-stage pipeline with one attempt, next to a demo
/// run; returns the hostile job's final state and recorded error.
async fn run_beside_demo(plugin: &str) -> (Harness, String, JobState, Option<String>) {
    let h = Harness::new().await;
    h.register(&DEMO_PLUGINS).await;
    h.register(&[plugin]).await;
    let hostile = h
        .submit(
            &ratchet_tests::one_stage_pipeline("hostile", plugin, "max_attempts = 1"),
            b"",
        )
        .await;
    let normal = h.submit_demo().await;
    h.run_until_idle(4).await;
    h.assert_demo_run_converged(&normal).await;
    let job = h.store.job_list(&hostile).await.expect("jobs").remove(0);
    (h, hostile, job.state, job.last_error)
}

async fn assert_dead_with(plugin: &str, reason: &str) {
    let (h, run, state, error) = run_beside_demo(plugin).await;
    assert_eq!(state, JobState::Dead, "{plugin}: {error:?}");
    let error = error.unwrap_or_default();
    assert!(
        error.contains(reason),
        "{plugin}: `{reason}` not in `{error}`"
    );
    assert_eq!(h.run_state(&run).await, "failed");
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    assert_eq!(
        attempts[0].error.as_deref(),
        Some(error.as_str()),
        "the reason is on the attempt too"
    );
    assert!(
        h.store
            .artifact_list(&run)
            .await
            .expect("artifacts")
            .iter()
            .all(|a| a.stage != "hostile")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_is_stopped_at_its_deadline() {
    assert_dead_with("infinite-loop", "exceeded its 300 ms deadline").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_is_stopped_at_its_memory_limit() {
    assert_dead_with("memory-bomb", "exceeded its memory limit of 32 MiB").await;
}

/// A guest panic is a Wasm trap: a retryable failed attempt (the plugin
/// drafts on its second attempt; `retries.rs` covers that), here with one
/// attempt allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_fails_the_attempt() {
    assert_dead_with("traps", "stage trapped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_giant_output_is_refused() {
    assert_dead_with("giant-output", "over the 65536-byte limit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_call_flood_is_cut_off() {
    assert_dead_with("host-call-flood", "more than 1000 host calls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_output_is_refused() {
    assert_dead_with("undeclared-output", "output `secret` is not declared").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_declared_output_is_refused() {
    assert_dead_with(
        "missing-output",
        "declared output `summary` was not returned",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_environment_and_sockets_are_out_of_reach() {
    let (h, run, state, error) = run_beside_demo("escape-artist").await;
    assert_eq!(state, JobState::Succeeded, "{error:?}");
    let report: Value = h.json(&run, "hostile", "report").await;
    for attempt in ["read_file", "list_dir", "write_file", "tcp"] {
        assert!(
            report[attempt].get("Err").is_some(),
            "{attempt} must fail: {report}"
        );
    }
    assert_eq!(report["env"], 0, "no environment variables: {report}");
}

/// Item 9b of #20: a worker runs a component under the manifest admitted
/// at registration, and refuses one whose `describe` says something else
/// now. Seen failing before the fix: the restarted worker (a new host,
/// nothing cached) took the component's new word and ran it (`succeeded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_describes_itself_otherwise_than_at_registration_is_refused() {
    let mut h = Harness::new().await;
    h.register(&["shifty-describe"]).await;
    let run = h
        .submit(
            &ratchet_tests::one_stage_pipeline("shifty", "shifty-describe", "max_attempts = 1"),
            b"",
        )
        .await;
    // A worker started after registration: it compiles and describes anew.
    h.rehost(ratchet_runtime::plugin::HostConfig::default());
    h.run_until_idle(1).await;
    let job = h.store.job_list(&run).await.expect("jobs").remove(0);
    assert_eq!(job.state, JobState::Dead);
    let error = job.last_error.unwrap_or_default();
    assert!(
        error.contains("`describe` now returns another manifest"),
        "{error}"
    );
}

/// Item 9a of #20: `memory_mb` bounds the whole instance, not each linear
/// memory. The component (built from WAT by `tests/build.rs`) grows two
/// memories to 12 MiB each under a limit of 16 MiB. Run on the on-demand
/// allocator, where nothing else bounds it (the pooling allocator refuses a
/// module with more than one memory when it is instantiated). Seen failing
/// before the fix: both memories grew, and the attempt ended at the
/// component's `unreachable` as a trap (retryable), not out of memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memories_together_are_bounded_by_the_memory_limit() {
    let h = Harness::with_host_config(ratchet_runtime::plugin::HostConfig::default()).await;
    let bytes = std::fs::read(env!("RATCHET_TWO_MEMORIES")).expect("two-memories component");
    ratchet_runtime::registry::plugin_register(h.store.as_ref(), &h.host, bytes, h.clock.as_ref())
        .await
        .expect("register");
    let run = h
        .submit(
            &ratchet_tests::one_stage_pipeline("greedy", "two-memories", "max_attempts = 1"),
            b"",
        )
        .await;
    h.run_until_idle(1).await;
    let job = h.store.job_list(&run).await.expect("jobs").remove(0);
    assert_eq!(job.state, JobState::Dead);
    let error = job.last_error.unwrap_or_default();
    assert!(
        error.contains("exceeded its memory limit of 16 MiB"),
        "{error}"
    );
}
