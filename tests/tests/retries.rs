//! Retries: retryable failures come back after a growing, jittered delay
//! (measured on an injected clock); fatal failures and exhausted attempts
//! end the stage, fail the run and cancel what has not started.
//!
//! Checked on the buggy shape: with a constant backoff (`exp = 0` in
//! `Backoff::delay_ms`) the growing-delay test fails; with fatal errors
//! classified retryable (`ExecError::is_retryable`) the fatal test fails.

use std::sync::Arc;

use ratchet_runtime::clock::{Clock, ManualClock};
use ratchet_runtime::scheduler::AttemptOutcome;
use ratchet_runtime::store::JobState;
use ratchet_tests::{Backend, Harness};

const FLAKY: &str = r#"
name = "flaky"
[[stage]]
name = "flaky"
plugin = "flaky@^1"
inputs = { config = "$input" }
[[stage]]
name = "verify"
plugin = "verify@^1"
inputs = { draft = "flaky.draft" }
"#;

async fn harness(backend: Backend) -> Option<(Arc<ManualClock>, Harness)> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let h = Harness::on(backend, clock.clone()).await?;
    h.register(&["flaky", "always-fatal", "verify", "publish"])
        .await;
    Some((clock, h))
}

ratchet_tests::backend_tests! {
    a_retryable_failure_is_retried_with_growing_delay => retried_with_growing_delay;
    a_fatal_failure_kills_the_stage_fails_the_run_and_cancels_dependents => fatal_kills_the_run;
    a_stage_out_of_attempts_is_dead => out_of_attempts_is_dead;
    a_trapping_plugin_fails_its_attempt_and_the_retry_succeeds => trap_is_a_failed_attempt;
}

async fn retried_with_growing_delay(backend: Backend) {
    let Some((clock, h)) = harness(backend).await else {
        return;
    };
    let run = h.submit(FLAKY, b"3").await;
    let sched = h.scheduler("worker", 30_000);
    let mut delays = Vec::new();
    for attempt in 1..=3 {
        let job = sched.claim(None).await.expect("claim").expect("due");
        assert_eq!((job.stage.as_str(), job.attempt), ("flaky", attempt));
        let outcome = sched.run_claimed(job).await.expect("run").outcome;
        let AttemptOutcome::Retrying { at, error } = outcome else {
            panic!("attempt {attempt} should be retried: {outcome:?}");
        };
        assert!(error.contains(&format!("attempt {attempt}")), "{error}");
        delays.push(at - clock.now_ms());
        clock.set(at - 1);
        assert!(
            sched.claim(None).await.expect("claim").is_none(),
            "not due before its time"
        );
        clock.set(at);
    }
    assert!(
        delays.windows(2).all(|w| w[1] > w[0]),
        "delays grow: {delays:?}"
    );
    assert!(
        (800..=1200).contains(&delays[0]),
        "first delay is 1 s ± 20 %: {delays:?}"
    );

    let job = sched.claim(None).await.expect("claim").expect("due");
    let outcome = sched.run_claimed(job).await.expect("run").outcome;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let job = sched
        .claim(None)
        .await
        .expect("claim")
        .expect("verify released");
    assert_eq!(job.stage, "verify");
    sched.run_claimed(job).await.expect("run");
    assert_eq!(h.run_state(&run).await, "succeeded");
    assert!(h.audit().await.is_clean());
}

async fn fatal_kills_the_run(backend: Backend) {
    let Some((_clock, h)) = harness(backend).await else {
        return;
    };
    let pipeline = r#"
name = "doomed"
[[stage]]
name = "doomed"
plugin = "always-fatal@^1"
[[stage]]
name = "verify"
plugin = "verify@^1"
inputs = { draft = "doomed.draft" }
[[stage]]
name = "publish"
plugin = "publish@^1"
inputs = { draft = "doomed.draft" }
"#;
    let run = h.submit(pipeline, b"").await;
    let sched = h.scheduler("worker", 30_000);
    let job = sched.claim(None).await.expect("claim").expect("due");
    let outcome = sched.run_claimed(job).await.expect("run").outcome;
    let AttemptOutcome::Dead { error } = outcome else {
        panic!("fatal must not be retried: {outcome:?}");
    };
    assert!(error.contains("can never be processed"), "{error}");
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let state = |s: &str| jobs.iter().find(|j| j.stage == s).expect("job").state;
    assert_eq!(state("doomed"), JobState::Dead);
    assert_eq!(state("verify"), JobState::Cancelled);
    assert_eq!(state("publish"), JobState::Cancelled);
    assert_eq!(h.run_state(&run).await, "failed");
    assert!(
        sched.claim(None).await.expect("claim").is_none(),
        "nothing left to run"
    );
    assert_eq!(
        h.outbox_events(&run).await,
        ["run.failed"],
        "no stage's event, the run's own"
    );
}

async fn out_of_attempts_is_dead(backend: Backend) {
    let Some((clock, h)) = harness(backend).await else {
        return;
    };
    let pipeline = FLAKY.replace(
        "name = \"flaky\"\n[[stage]]",
        "name = \"flaky\"\nmax_attempts = 2\n[[stage]]",
    );
    let run = h.submit(&pipeline, b"10").await;
    let sched = h.scheduler("worker", 30_000);
    let job = sched.claim(None).await.expect("claim").expect("due");
    let AttemptOutcome::Retrying { at, .. } = sched.run_claimed(job).await.expect("run").outcome
    else {
        panic!("attempt 1 of 2 is retried");
    };
    clock.set(at);
    let job = sched.claim(None).await.expect("claim").expect("due");
    let outcome = sched.run_claimed(job).await.expect("run").outcome;
    assert!(
        matches!(outcome, AttemptOutcome::Dead { .. }),
        "{outcome:?}"
    );
    assert_eq!(h.run_state(&run).await, "failed");
}

async fn trap_is_a_failed_attempt(backend: Backend) {
    let Some((clock, h)) = harness(backend).await else {
        return;
    };
    h.register(&["traps"]).await;
    let run = h
        .submit(&ratchet_tests::one_stage_pipeline("trap", "traps", ""), b"")
        .await;
    let sched = h.scheduler("worker", 30_000);
    let job = sched.claim(None).await.expect("claim").expect("due");
    let outcome = sched
        .run_claimed(job)
        .await
        .expect("the host survives the trap")
        .outcome;
    let AttemptOutcome::Retrying { at, error } = outcome else {
        panic!("a trap is a retryable failed attempt: {outcome:?}");
    };
    assert!(error.contains("trapped"), "{error}");
    clock.set(at);
    let job = sched.claim(None).await.expect("claim").expect("due");
    let outcome = sched.run_claimed(job).await.expect("run").outcome;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    assert_eq!(h.run_state(&run).await, "succeeded");
}
