//! Store conformance, runs: submission writes the whole DAG at once, and an
//! idempotency key submits one run, on every backend.

use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::plugin::Caps;
use ratchet_runtime::registry;
use ratchet_runtime::store::JobState;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness};

ratchet_tests::backend_tests! {
    submit_writes_every_job_edge_and_binding_with_roots_ready => submit_writes_the_dag;
    an_idempotency_key_submits_one_run => idempotency_key;
}

async fn submit_writes_the_dag(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let run = h.submit_demo().await;
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let state = |stage: &str| {
        let j = jobs.iter().find(|j| j.stage == stage).expect("job");
        (j.state, j.pending)
    };
    assert_eq!(state("draft"), (JobState::Ready, 0));
    assert_eq!(state("verify"), (JobState::Blocked, 1));
    assert_eq!(state("publish"), (JobState::Blocked, 1));
    assert_eq!(
        state("prepare-next"),
        (JobState::Blocked, 2),
        "data and after edge"
    );
    let input = h
        .store
        .artifact_get(&run, "$run", "input")
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(
        input.bytes, b"a test release",
        "the run input is an artifact"
    );
    let loaded = h
        .store
        .job_inputs_load(&run, "verify")
        .await
        .expect("inputs");
    assert_eq!(loaded.len(), 1);
    assert_eq!(
        (
            loaded[0].from_stage.as_str(),
            loaded[0].from_output.as_str()
        ),
        ("draft", "draft")
    );
    assert!(loaded[0].artifact.is_none(), "not produced yet");
}

async fn idempotency_key(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let pipeline =
        Pipeline::parse("demo.toml", ratchet_runtime::bundled::DEMO_PIPELINE).expect("parse");
    let caps = Caps::default();
    let submit = || {
        registry::run_submit(
            h.store.as_ref(),
            &pipeline,
            b"x".to_vec(),
            Some("key-1".into()),
            &caps,
            h.clock.as_ref(),
        )
    };
    let first = submit().await.expect("first");
    let second = submit().await.expect("second");
    assert!(matches!(
        first,
        ratchet_runtime::store::RunSubmitOutcome::Created(_)
    ));
    assert!(matches!(
        second,
        ratchet_runtime::store::RunSubmitOutcome::Existing(_)
    ));
    assert_eq!(first.run_id(), second.run_id());
    assert_eq!(h.store.run_list().await.expect("runs").len(), 1);
}
