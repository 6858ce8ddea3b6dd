//! Crash window: a real `ratchet worker` process dies at every named crash
//! point, by exiting and by panicking, at the first stage and at `publish`;
//! a restarted worker finishes the run with every invariant intact.
//!
//! Checked on the buggy shape: with `job_complete` committing the artifact
//! and job first and releasing dependents in a second transaction (crash
//! point between), and the reconciler's edge repair turned off, both
//! `after_commit` cases fail: the run stays stuck after the restart. With
//! the reconciler on, it repairs that slip (ADR 0003).

use ratchet_runtime::crash::CRASH_EXIT_CODE;
use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness, output, ratchet};

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

/// `skip` hits of the point pass; the next one crashes. With one worker
/// task the stages run draft, verify, publish, prepare-next, so `skip = 2`
/// crashes inside `publish`, the stage with the outbox event.
async fn crash_then_recover(backend: Backend, point: &str, action: &str, skip: u32) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let run = h.submit_demo().await;

    let failpoint = if skip == 0 {
        format!("{point}={action}")
    } else {
        format!("{point}={skip}*off->{action}")
    };
    let mut doomed = ratchet(BIN, &h.url);
    doomed
        .args([
            "worker",
            "--until-idle",
            "--concurrency",
            "1",
            "--lease-ms",
            "300",
        ])
        .args(["--worker-id", "doomed"])
        .env("FAILPOINTS", &failpoint);
    let out = output(doomed).await;
    if action == "return(exit)" {
        assert_eq!(
            out.status.code(),
            Some(CRASH_EXIT_CODE),
            "{failpoint}: {out:?}"
        );
    } else {
        assert!(
            !out.status.success(),
            "{failpoint}: the worker should have died: {out:?}"
        );
    }
    let state = h.run_state(&run).await;
    assert_eq!(
        state, "running",
        "{failpoint}: the crash left the run unfinished"
    );

    let mut survivor = ratchet(BIN, &h.url);
    survivor.args([
        "worker",
        "--until-idle",
        "--concurrency",
        "2",
        "--worker-id",
        "survivor",
    ]);
    let out = output(survivor).await;
    assert!(
        out.status.success(),
        "{failpoint}: restarted worker failed: {out:?}"
    );

    h.assert_demo_run_converged(&run).await;
    let audit = output({
        let mut c = ratchet(BIN, &h.url);
        c.arg("audit");
        c
    })
    .await;
    assert!(
        audit.status.success(),
        "{failpoint}: `ratchet audit` failed: {audit:?}"
    );
}

async fn every_position(backend: Backend, point: &str, action: &str) {
    crash_then_recover(backend, point, action, 0).await;
    if point != "after_model_call" {
        // Only `draft` calls the model; every other point is also hit by
        // `publish`, the third stage.
        crash_then_recover(backend, point, action, 2).await;
    }
}

macro_rules! crash_tests {
    ($($name:ident: $point:literal, $action:literal;)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_sqlite() {
                every_position(Backend::Sqlite, $point, $action).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_postgres() {
                every_position(Backend::Postgres, $point, $action).await;
            }
        }
    )*};
}

crash_tests! {
    process_exit_after_claim_converges_after_restart: "after_claim", "return(exit)";
    process_exit_after_model_call_converges_after_restart: "after_model_call", "return(exit)";
    process_exit_after_execute_converges_after_restart: "after_execute", "return(exit)";
    process_exit_after_persist_converges_after_restart: "after_persist", "return(exit)";
    process_exit_after_outbox_insert_converges_after_restart: "after_outbox_insert", "return(exit)";
    process_exit_after_commit_converges_after_restart: "after_commit", "return(exit)";
    panic_after_claim_converges_after_restart: "after_claim", "panic";
    panic_after_model_call_converges_after_restart: "after_model_call", "panic";
    panic_after_execute_converges_after_restart: "after_execute", "panic";
    panic_after_persist_converges_after_restart: "after_persist", "panic";
    panic_after_outbox_insert_converges_after_restart: "after_outbox_insert", "panic";
    panic_after_commit_converges_after_restart: "after_commit", "panic";
}

ratchet_tests::backend_tests! {
    process_exit_inside_a_group_commit_converges_after_restart => crash_inside_a_group_commit;
}

/// Twelve parallel stages and a join under eight worker tasks, so
/// completions reach the group committer together; the process exits at the
/// third completion's persist, inside whichever batch holds it. That batch
/// rolls back whole, and a restarted worker finishes every stage once.
async fn crash_inside_a_group_commit(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["pass", "noop"]).await;
    let mut pipeline = String::from("name = \"fan\"\n");
    let stages: Vec<String> = (0..12).map(|i| format!("f{i}")).collect();
    for stage in &stages {
        pipeline.push_str(&format!(
            "[[stage]]\nname = \"{stage}\"\nplugin = \"pass@^1\"\ninputs = {{ in = \"$input\" }}\n"
        ));
    }
    pipeline.push_str(&format!(
        "[[stage]]\nname = \"join\"\nplugin = \"noop@^1\"\nafter = {stages:?}\n"
    ));
    let run = h.submit(&pipeline, b"fan").await;

    let mut doomed = ratchet(BIN, &h.url);
    doomed
        .args(["worker", "--until-idle", "--concurrency", "8"])
        .args(["--lease-ms", "300", "--worker-id", "doomed"])
        .env("FAILPOINTS", "after_persist=2*off->return(exit)");
    let out = output(doomed).await;
    assert_eq!(out.status.code(), Some(CRASH_EXIT_CODE), "{out:?}");
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let done = jobs.iter().filter(|j| j.state.as_str() == "succeeded");
    assert!(
        done.count() < 3,
        "the transaction holding the third completion rolled back"
    );

    let mut survivor = ratchet(BIN, &h.url);
    survivor.args(["worker", "--until-idle", "--concurrency", "8"]);
    let out = output(survivor).await;
    assert!(out.status.success(), "restarted worker failed: {out:?}");

    assert_eq!(h.run_state(&run).await, "succeeded");
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    for stage in stages.iter().chain([&"join".to_string()]) {
        let won = attempts
            .iter()
            .filter(|a| &a.stage == stage && a.outcome == "succeeded")
            .count();
        assert_eq!(won, 1, "`{stage}` succeeded exactly once");
    }
    let artifacts = h.store.artifact_list(&run).await.expect("artifacts");
    assert_eq!(artifacts.len(), 14, "the run's input and one per stage");
    let audit = h.audit().await;
    assert!(audit.is_clean(), "{audit:?}");
}
