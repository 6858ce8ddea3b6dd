//! Capability grants and operator caps: a plugin gets a host interface only
//! when its manifest asks for it and the operator's policy grants it, and
//! never more time, memory or output than the policy allows.
//!
//! Checked on the buggy shape: with `Policy::admit` admitting everything,
//! the four registration tests fail.

use ratchet_runtime::manifest::Capability;
use ratchet_runtime::plugin::{Caps, HostConfig, PluginError, Policy};
use ratchet_runtime::registry::{self, RegistryError};
use ratchet_runtime::scheduler::AttemptOutcome;
use ratchet_runtime::store::JobState;
use ratchet_tests::{Harness, plugin_path};

async fn harness(policy: Policy) -> Harness {
    let config = HostConfig {
        policy,
        ..HostConfig::default()
    };
    Harness::with_host_config(config).await
}

/// Registers `plugin` and returns the refusal, checking nothing was stored.
async fn refusal(h: &Harness, plugin: &str) -> String {
    let bytes = std::fs::read(plugin_path(plugin)).expect("compiled plugin");
    let err = registry::plugin_register(h.store.as_ref(), &h.host, bytes, h.clock.as_ref())
        .await
        .expect_err("registration must be refused");
    assert!(
        matches!(err, RegistryError::Plugin(PluginError::NotAdmitted(_))),
        "{err:?}"
    );
    assert!(h.store.plugin_list().await.expect("list").is_empty());
    err.to_string()
}

/// A worker host under another policy, as an operator who tightened the
/// policy after registration would run.
fn rehost(h: &mut Harness, policy: Policy) {
    h.rehost(HostConfig {
        policy,
        ..HostConfig::default()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_names_an_import_the_manifest_does_not_ask_for() {
    let h = harness(Policy::default()).await;
    let err = refusal(&h, "undeclared-capability").await;
    assert!(err.contains("`ratchet:stage/model@0.2.0`"), "{err}");
    assert!(err.contains("capabilities = [\"model\"]"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_refuses_a_capability_the_policy_withholds() {
    let h = harness(Policy::default().with_grants([Capability::Log])).await;
    let err = refusal(&h, "draft").await;
    assert!(err.contains("`model` capability"), "{err}");
    assert!(err.contains("granted: [log]"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_refuses_limits_over_the_operators_caps() {
    let caps = Caps {
        memory_mb: 16,
        ..Caps::default()
    };
    let h = harness(Policy::default().with_caps(caps)).await;
    let err = refusal(&h, "memory-bomb").await;
    assert!(err.contains("limits.memory_mb = 32"), "{err}");
    assert!(err.contains("cap of 16"), "{err}");
}

/// The plugin is handed `access-denied` through WIT and decides what to do
/// (the SDK makes it fatal); the host neither traps it nor asks the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withheld_capability_answers_access_denied() {
    let mut h = harness(Policy::default()).await;
    h.register(&["draft"]).await;
    let run = h
        .submit(
            "name = \"d\"\nmax_attempts = 2\n[[stage]]\nname = \"draft\"\nplugin = \"draft@^1\"\ninputs = { topic = \"$input\" }\n",
            b"a topic",
        )
        .await;
    rehost(&mut h, Policy::default().with_grants([Capability::Log]));
    h.run_until_idle(2).await;
    let job = h.store.job_list(&run).await.expect("jobs").remove(0);
    assert_eq!(job.state, JobState::Dead, "{:?}", job.last_error);
    let error = job.last_error.unwrap_or_default();
    assert!(error.contains("model access denied"), "{error}");
    assert!(error.contains("stage failed (fatal)"), "{error}");
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    assert_eq!(attempts.len(), 1, "access-denied is not retried");
    let journal = h
        .store
        .model_call_get(&run, "draft", 0)
        .await
        .expect("journal");
    assert!(journal.is_none(), "the model was not asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_clamped_to_caps_lowered_after_registration() {
    let mut h = harness(Policy::default()).await;
    h.register(&["infinite-loop"]).await;
    let run = h
        .submit(
            &ratchet_tests::one_stage_pipeline("spin", "infinite-loop", "max_attempts = 1"),
            b"",
        )
        .await;
    let caps = Caps {
        timeout_ms: 100,
        ..Caps::default()
    };
    rehost(&mut h, Policy::default().with_caps(caps));
    h.run_until_idle(1).await;
    let job = h.store.job_list(&run).await.expect("jobs").remove(0);
    assert_eq!(job.state, JobState::Dead);
    let error = job.last_error.unwrap_or_default();
    assert!(error.contains("exceeded its 100 ms deadline"), "{error}");
}

/// `log` returns nothing, so a withheld `log` cannot answer
/// `access-denied`: the line is dropped, the attempt goes on, and the drop
/// is counted in its report. Seen failing with the count left out of
/// `CallContext::report` (0 lines dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withheld_log_is_dropped_and_counted() {
    let mut h = harness(Policy::default()).await;
    h.register(&["hostile-text"]).await;
    let run = h
        .submit(
            "name = \"h\"\nmax_attempts = 1\n[[stage]]\nname = \"h\"\nplugin = \"hostile-text@^1\"\ninputs = { mode = \"$input\" }\n",
            b"nul-log",
        )
        .await;
    rehost(&mut h, Policy::default().with_grants([Capability::Model]));
    let sched = h.scheduler("w", 30_000);
    let job = sched.claim(None).await.expect("claim").expect("a job");
    let finished = sched.run_claimed(job).await.expect("run");
    assert!(
        matches!(finished.outcome, AttemptOutcome::Succeeded { .. }),
        "{:?}",
        finished.outcome
    );
    assert_eq!(finished.report.log_lines_dropped, 1);
    assert_eq!(h.run_state(&run).await, "succeeded");
}

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

/// One line on stderr, exit code 2, and nothing registered.
async fn assert_refused(h: &Harness, cmd: tokio::process::Command, needle: &str) {
    let out = ratchet_tests::output(cmd).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(needle), "`{needle}` not in {stderr}");
    assert!(h.store.plugin_list().await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_refuses_in_one_line() {
    let h = harness(Policy::default()).await;
    let mut add = ratchet_tests::ratchet(BIN, &h.url);
    add.args(["plugin", "add"])
        .arg(plugin_path("undeclared-capability"));
    assert_refused(&h, add, "`ratchet:stage/model@0.2.0`").await;

    let dir = tempfile::tempdir().expect("temp dir");
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "grants = [\"log\"]\n").expect("write policy");
    let mut add = ratchet_tests::ratchet(BIN, &h.url);
    add.arg("--policy")
        .arg(&policy)
        .args(["plugin", "add"])
        .arg(plugin_path("draft"));
    assert_refused(&h, add, "`model` capability").await;

    std::fs::write(&policy, "grants = [\"log\"]\n[caps]\nmemory = 1\n").expect("write policy");
    let mut add = ratchet_tests::ratchet(BIN, &h.url);
    add.arg("--policy")
        .arg(&policy)
        .args(["plugin", "add"])
        .arg(plugin_path("noop"));
    assert_refused(&h, add, "policy.toml:3: unknown field `memory`").await;
}
