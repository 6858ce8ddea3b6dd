//! Lease renewal: a stage that runs longer than a lease keeps its job
//! while its worker lives, and loses it once the worker stops renewing or
//! has held it longer than the operator's policy lets any attempt run.
//!
//! Checked on the buggy shapes: with `Scheduler::renew_leases` returning
//! `Ok(0)` without writing (no renewal, as before it existed), the rescuer
//! takes the slow attempt's job over at its second step, 1.2 leases in;
//! with SQLite's renewal matching only `state = 'running'` (no worker, no
//! attempt number), the old worker moves the rescuer's lease; with the
//! policy's bound removed from the filter, the wedged attempt is renewed.

use std::sync::Arc;

use ratchet_runtime::clock::ManualClock;
use ratchet_runtime::plugin::{Caps, HostConfig, Policy};
use ratchet_runtime::scheduler::AttemptOutcome;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness};

const LEASE_MS: i64 = 1_000;

ratchet_tests::backend_tests! {
    an_attempt_running_longer_than_its_lease_is_not_taken_over_while_renewed => renewed_lease_is_kept;
    a_lease_lapses_once_its_attempt_has_run_longer_than_the_policy_admits => wedged_lease_lapses;
}

async fn renewed_lease_is_kept(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    h.submit_demo().await;
    let slow = h.scheduler("slow", LEASE_MS);
    let rescuer = h.scheduler("rescuer", LEASE_MS);

    let job = slow.claim(None).await.expect("claim").expect("draft");
    // Nearly five leases long, renewed every 0.6 of one.
    for step in 1..=8 {
        clock.advance(LEASE_MS * 6 / 10);
        slow.renew_leases().await.expect("renew");
        let taken = rescuer.claim(None).await.expect("claim");
        assert!(
            taken.is_none(),
            "step {step}: a renewed lease was taken over: {taken:?}"
        );
    }
    let execution = slow.execute(&job).await.expect("execute");
    let outcome = slow.finish(&job, &execution).await.expect("finish");
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        slow.renew_leases().await.expect("renew"),
        0,
        "a finished attempt is no longer renewed"
    );

    // The next stage's worker stops renewing (it died): one lease later
    // its job is taken over.
    let next = slow.claim(None).await.expect("claim").expect("verify");
    clock.advance(LEASE_MS / 2);
    assert_eq!(slow.renew_leases().await.expect("renew"), 1);
    clock.advance(LEASE_MS + 1);
    let taken = rescuer
        .claim(None)
        .await
        .expect("claim")
        .expect("a lease not renewed lapses");
    assert_eq!(
        (taken.job_id, taken.attempt),
        (next.job_id, next.attempt + 1)
    );
    clock.advance(LEASE_MS / 10);
    assert_eq!(
        slow.renew_leases().await.expect("renew"),
        0,
        "an attempt taken over is not renewed by its old worker"
    );
}

async fn wedged_lease_lapses(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(mut h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    let caps = Caps {
        timeout_ms: 5_000,
        ..Caps::default()
    };
    h.rehost(HostConfig {
        policy: Policy::default().with_caps(caps),
        ..HostConfig::default()
    });
    h.register(&DEMO_PLUGINS).await;
    h.submit_demo().await;
    let wedged = h.scheduler("wedged", LEASE_MS);
    let rescuer = h.scheduler("rescuer", LEASE_MS);

    let job = wedged.claim(None).await.expect("claim").expect("draft");
    let mut renewed_for = 0;
    while renewed_for + LEASE_MS / 2 < 5_000 {
        clock.advance(LEASE_MS / 2);
        renewed_for += LEASE_MS / 2;
        assert_eq!(wedged.renew_leases().await.expect("renew"), 1);
    }
    clock.advance(LEASE_MS / 2);
    assert_eq!(
        wedged.renew_leases().await.expect("renew"),
        0,
        "renewed past the longest attempt the policy admits"
    );
    clock.advance(LEASE_MS);
    let taken = rescuer
        .claim(None)
        .await
        .expect("claim")
        .expect("the wedged attempt's lease lapses");
    assert_eq!((taken.job_id, taken.attempt), (job.job_id, job.attempt + 1));
}
