//! Store conformance, reconcile: what slipped is repaired, on every backend.

use std::sync::Arc;

use ratchet_runtime::clock::{Clock, ManualClock};
use ratchet_runtime::store::JobState;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness};

ratchet_tests::backend_tests! {
    a_lease_that_expires_on_the_last_attempt_kills_the_job => last_lease_expired;
}

async fn last_lease_expired(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let pipeline = ratchet_runtime::bundled::DEMO_PIPELINE
        .replace("name = \"demo\"", "name = \"demo\"\nmax_attempts = 1");
    let run = h.submit(&pipeline, b"").await;
    let sched = h.scheduler("vanishing-worker", 1_000);
    let job = sched.claim(None).await.expect("claim").expect("draft");
    assert_eq!(job.attempt, 1);

    assert_eq!(
        h.store.reconcile(clock.now_ms()).await.expect("reconcile"),
        Default::default()
    );
    clock.advance(1_000);
    assert!(
        sched.claim(None).await.expect("claim").is_none(),
        "no attempts left to take over"
    );
    let report = h.store.reconcile(clock.now_ms()).await.expect("reconcile");
    assert_eq!(report.dead_expired_leases, 1);
    let jobs = h.store.job_list(&run).await.expect("jobs");
    assert_eq!(
        jobs.iter()
            .find(|j| j.stage == "draft")
            .expect("draft")
            .state,
        JobState::Dead
    );
    assert!(
        jobs.iter()
            .filter(|j| j.stage != "draft")
            .all(|j| j.state == JobState::Cancelled)
    );
    assert_eq!(h.run_state(&run).await, "failed");
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    assert_eq!(attempts[0].outcome, "lease_expired");
    assert!(h.audit().await.is_clean());
}
