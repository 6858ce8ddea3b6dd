//! Zombies: an attempt whose lease expired and was taken over changes
//! nothing when it finally completes or fails (the attempt number fences it).
//!
//! Checked on the buggy shape: with the fence reduced to `WHERE id = ?`
//! (store/sqlite/jobs.rs), the zombie's completion commits its proposal and
//! both assertions on the unchanged store fail.

use std::sync::Arc;

use ratchet_runtime::clock::ManualClock;
use ratchet_runtime::scheduler::AttemptOutcome;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness};
use serde_json::json;

async fn snapshot(h: &Harness, run: &str) -> serde_json::Value {
    let s = &h.store;
    json!({
        "jobs": s.job_list(run).await.expect("jobs"),
        "artifacts": s.artifact_list(run).await.expect("artifacts"),
        "attempts": s.attempt_list(run).await.expect("attempts"),
        "outbox": s.outbox_list(Some(run)).await.expect("outbox"),
        "journal": s.model_call_list(run).await.expect("journal"),
    })
}

ratchet_tests::backend_tests! {
    zombie_worker_cannot_complete_or_fail_after_its_lease_was_taken_over => zombie_is_fenced_out;
}

async fn zombie_is_fenced_out(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let run = h.submit_demo().await;
    let zombie = h.scheduler("zombie", 1_000);
    let rescuer = h.scheduler("rescuer", 1_000);

    let stale = zombie.claim(None).await.expect("claim").expect("draft");
    let stale_execution = zombie.execute(&stale).await.expect("execute");
    clock.advance(1_001);
    let fresh = rescuer
        .claim(None)
        .await
        .expect("claim")
        .expect("expired lease is claimable");
    assert_eq!((fresh.job_id, fresh.attempt), (stale.job_id, 2));

    let before = snapshot(&h, &run).await;
    let outcome = zombie
        .finish(&stale, &stale_execution)
        .await
        .expect("finish");
    assert_eq!(outcome, AttemptOutcome::LeaseLost);
    assert_eq!(
        snapshot(&h, &run).await,
        before,
        "a fenced-out completion changes nothing"
    );

    let mut failing = stale_execution;
    failing.result = Err(ratchet_runtime::plugin::ExecError::Retryable(
        "late failure".into(),
    ));
    assert_eq!(
        zombie.finish(&stale, &failing).await.expect("fail"),
        AttemptOutcome::LeaseLost
    );
    assert_eq!(
        snapshot(&h, &run).await,
        before,
        "a fenced-out failure changes nothing"
    );

    let execution = rescuer.execute(&fresh).await.expect("execute");
    let outcome = rescuer.finish(&fresh, &execution).await.expect("finish");
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    assert_eq!(attempts[0].outcome, "lease_expired");
    assert_eq!(attempts[1].outcome, "succeeded");
}
