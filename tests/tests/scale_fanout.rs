//! One run of a wide fan-out/fan-in (F parallel `pass` stages, then one
//! `noop` join after all of them) completes on every backend: every stage
//! once, the join last, the audit clean, nothing left for a reconcile.
//!
//! F is 2,000 in the normal suite (CI's size) and `RATCHET_FANOUT_STAGES`
//! by hand: 100,000 is item 12 of #20, reported with its times in
//! BENCHMARKS.md (`ratchet bench --fanout 100000` measures them; this test
//! checks the outcome, not the speed).

use std::sync::Arc;

use ratchet_runtime::bench::fanout_pipeline;
use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::store::JobState;
use ratchet_tests::{Backend, Harness};

ratchet_tests::backend_tests! {
    a_wide_fan_out_and_fan_in_completes => wide_fanout;
}

fn stages() -> usize {
    std::env::var("RATCHET_FANOUT_STAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

async fn wide_fanout(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["pass", "noop"]).await;
    let stages = stages();
    let run = h.submit(&fanout_pipeline(stages), b"fan").await;
    h.run_until_idle(16).await;

    assert_eq!(h.run_state(&run).await, "succeeded");
    let jobs = h.store.job_list(&run).await.expect("jobs");
    assert_eq!(jobs.len(), stages + 1);
    assert!(jobs.iter().all(|j| j.state == JobState::Succeeded));
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    assert_eq!(attempts.len(), stages + 1, "every stage ran once");
    let join = attempts
        .iter()
        .find(|a| a.stage == "join")
        .expect("the join ran");
    let last_success = jobs
        .iter()
        .filter(|j| j.stage != "join")
        .filter_map(|j| j.succeeded_seq)
        .max()
        .expect("the fanned-out stages succeeded");
    assert!(
        join.claim_seq > last_success,
        "the join started after every stage it waits for had committed"
    );
    let report = h.audit().await;
    assert!(report.is_clean(), "{:#?}", report.violations);
    let reconciled = h
        .store
        .reconcile(h.clock.now_ms())
        .await
        .expect("reconcile");
    assert!(!reconciled.changed(), "{reconciled:?}");
}
