//! PostgreSQL writes a common batch in one call of `ratchet_complete_batch`
//! (ADR 0010). The steps `after_persist` and `after_outbox_insert` sit
//! between all run inside that call, so there the two points are one
//! moment: the last before the call commits. A process stopped there
//! leaves nothing of the batch, and an armed crash point does not switch
//! the batch to the step-by-step path. A test binary of its own: crash
//! points are process-wide.
//!
//! Seen failing with the two points passed after the call instead (the
//! batch had committed: the job succeeded), and with a configured point
//! sending every batch down the step-by-step path (3 batches in steps).

use std::sync::Arc;

use ratchet_runtime::clock::{Clock, ManualClock};
use ratchet_runtime::store::{
    CompleteOutcome, History, JobClaim, JobState, PostgresStore, Queue, RUN_INPUT_STAGE,
};
use ratchet_tests::{Backend, Harness, completion, one_stage_pipeline};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_inside_the_one_call_leaves_nothing_of_the_batch() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(Backend::Postgres, clock.clone()).await else {
        return;
    };
    h.register(&["noop"]).await;
    let run = h.submit(&one_stage_pipeline("a", "noop", ""), b"").await;
    let pg = PostgresStore::open(&h.url).await.expect("open");
    let claim = JobClaim {
        worker: "w".into(),
        now: clock.now_ms(),
        lease_ms: 60_000,
        limit: 1,
        only_job: None,
        caps: Default::default(),
    };
    let job = pg.job_claim(claim).await.expect("claim").remove(0);

    for point in ["after_persist", "after_outbox_insert"] {
        fail::cfg(point, "panic").expect("arm the point");
        let (store, done) = (pg.clone(), completion(&job, "w", clock.now_ms()));
        let crashed = tokio::spawn(async move { store.job_complete(done).await }).await;
        fail::cfg(point, "off").expect("disarm");
        assert!(
            crashed.as_ref().is_err_and(|e| e.is_panic()),
            "{point}: {crashed:?}"
        );
        let jobs = pg.job_list(&run).await.expect("jobs");
        assert_eq!(jobs[0].state, JobState::Running, "{point}");
        let artifacts = pg.artifact_list(&run).await.expect("artifacts");
        assert!(
            artifacts.iter().all(|a| a.stage == RUN_INPUT_STAGE),
            "{point}: {artifacts:?}"
        );
    }

    let done = completion(&job, "w", clock.now_ms());
    let outcome = pg.job_complete(done).await.expect("complete");
    assert!(matches!(outcome, CompleteOutcome::Completed { .. }));
    assert_eq!(pg.batches_in_steps(), 0, "every batch in one call");
    assert_eq!(h.run_state(&run).await, "succeeded");
    let stored = pg.artifact_get(&run, "a", "out").await.expect("artifact");
    assert!(stored.is_some(), "the batch committed");
}
