//! Store conformance, reconcile: what slipped is repaired, on every backend.

use std::sync::Arc;

use ratchet_runtime::clock::{Clock, ManualClock};
use ratchet_runtime::store::{
    JobState, RECONCILE_LEASES_PER_BATCH, RECONCILE_RUNS_PER_BATCH, ReconcileReport,
};
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness, TWO_STAGES};

ratchet_tests::backend_tests! {
    a_lease_that_expires_on_the_last_attempt_kills_the_job => last_lease_expired;
    reconcile_repairs_everything_in_bounded_batches => bounded_batches;
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

    let report = h.store.reconcile(clock.now_ms()).await.expect("reconcile");
    assert!(!report.changed(), "{report:?}");
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

/// One more lapsed lease than a batch ends, and two pages and one run of
/// running runs whose dependency counts drifted: every one is repaired, in
/// a transaction per batch (2 for the leases, 3 for the runs), none over
/// the whole database. Seen failing on the old shape (one transaction for
/// everything, emulated by batch sizes larger than the database):
/// `transactions` was 2 where 5 was asserted, with the same repairs.
async fn bounded_batches(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    h.register(&["noop", "pass"]).await;
    let last_attempt = TWO_STAGES.replace("name = \"two\"", "name = \"two\"\nmax_attempts = 1");
    let lapsing = RECONCILE_LEASES_PER_BATCH + 1;
    let mut lapsed_runs = Vec::new();
    for i in 0..lapsing {
        lapsed_runs.push(
            h.submit(&last_attempt, format!("lapsing {i}").as_bytes())
                .await,
        );
    }
    let sched = h.scheduler("vanishing-worker", 1_000);
    let claimed = sched.claim_many(lapsing).await.expect("claim");
    assert_eq!(claimed.len(), lapsing);
    clock.advance(1_000);

    let drifting = 2 * RECONCILE_RUNS_PER_BATCH + 1;
    for i in 0..drifting {
        h.submit(TWO_STAGES, format!("drifting {i}").as_bytes())
            .await;
    }
    h.raw_sql("UPDATE jobs SET pending = 7 WHERE stage = 'b' AND state = 'blocked'")
        .await;

    let report = h.store.reconcile(clock.now_ms()).await.expect("reconcile");
    assert_eq!(
        report,
        ReconcileReport {
            dead_expired_leases: lapsing as u64,
            // The drifted runs' `b` back to one unsatisfied edge; the
            // lapsed runs' `b` was cancelled with its run.
            pending_repaired: drifting as u64,
            edges_repaired: 0,
            runs_finished: 0,
            gates_timed_out: 0,
            transactions: 2 + 3,
        }
    );
    for run in [&lapsed_runs[0], &lapsed_runs[lapsing - 1]] {
        assert_eq!(h.run_state(run).await, "failed");
    }
    let again = h.store.reconcile(clock.now_ms()).await.expect("reconcile");
    assert!(!again.changed(), "{again:?}");
    assert!(h.audit().await.is_clean());
}
