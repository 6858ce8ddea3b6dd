//! `ratchet upgrade` decides inside the repin's transaction: a stage that
//! journaled a model answer since the caller looked is not repinned, and a
//! new version's `after` dependencies become durable edges (refused when
//! the run lacks the stage or the edge would close a cycle).

use std::sync::Arc;

use ratchet_runtime::clock::ManualClock;
use ratchet_runtime::registry::{self, RegistryError};
use ratchet_runtime::store::{JobRepin, JobState, ModelCallPut, RepinOutcome};
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness};

ratchet_tests::backend_tests! {
    a_repin_is_refused_when_the_stage_journaled_since_the_caller_looked => journaled_meanwhile;
    a_new_versions_after_becomes_an_edge_the_stage_waits_for => after_becomes_an_edge;
    a_new_versions_after_is_refused_for_a_missing_stage_or_a_cycle => after_refused;
}

async fn harness(backend: Backend) -> Option<(Arc<ManualClock>, Harness)> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let h = Harness::on(backend, clock.clone()).await?;
    h.register(&DEMO_PLUGINS).await;
    Some((clock, h))
}

/// Item 8 of #20. Seen failing before the fix: the registry looked at the
/// journal before the repin's transaction, and the store repinned a stage
/// whose journal had an answer by then (`Repinned`).
async fn journaled_meanwhile(backend: Backend) {
    let Some((_clock, h)) = harness(backend).await else {
        return;
    };
    h.register(&["draft-v2"]).await;
    let run = h.submit_demo().await;
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let draft = jobs.iter().find(|j| j.stage == "draft").expect("draft");
    // A claim between the caller's checks and the repin journals a call.
    h.store
        .model_call_put(ModelCallPut {
            run_id: run.clone(),
            stage: "draft".into(),
            index: 0,
            request_digest: "asked meanwhile".into(),
            response: "an answer".into(),
            rejected: false,
            attempt: 1,
            now: 0,
            usage: None,
            finish_reason: None,
            model: None,
            kind: Default::default(),
            http: None,
        })
        .await
        .expect("journal");
    let v2 = registry::plugin_versions(h.store.as_ref(), "draft", None)
        .await
        .expect("versions")
        .into_iter()
        .find(|p| p.version == "2.0.0")
        .expect("draft@2.0.0");
    let outcome = h
        .store
        .job_repin(JobRepin {
            run_id: run.clone(),
            stage: "draft".into(),
            from_digest: draft.plugin_digest.clone().expect("a plugin stage"),
            to_digest: v2.digest.clone(),
            emits: Vec::new(),
            after: Vec::new(),
            detail: "test".into(),
            now: 0,
        })
        .await
        .expect("repin");
    assert_eq!(outcome, RepinOutcome::Journaled);
    let pinned = h.store.job_list(&run).await.expect("jobs");
    let pinned = pinned.iter().find(|j| j.stage == "draft").expect("draft");
    assert_eq!(pinned.plugin_digest, draft.plugin_digest);
}

/// Item 8 of #20. Seen failing before the fix: the upgrade repinned
/// `verify` but wrote no edge from `publish`, so `verify` ran as soon as
/// `draft` succeeded, before `publish`.
async fn after_becomes_an_edge(backend: Backend) {
    let Some((clock, h)) = harness(backend).await else {
        return;
    };
    let run = h.submit_demo().await;
    h.register(&["verify-after-publish"]).await;
    let to = semver::Version::new(1, 1, 0);
    registry::stage_upgrade(h.store.as_ref(), &run, "verify", &to, clock.as_ref())
        .await
        .expect("upgrade");
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let verify = jobs.iter().find(|j| j.stage == "verify").expect("verify");
    assert_eq!((verify.state, verify.pending), (JobState::Blocked, 2));

    let sched = h.scheduler("worker", 30_000);
    let draft = sched.claim(None).await.expect("claim").expect("draft");
    sched.run_claimed(draft).await.expect("draft");
    let next = sched.claim(None).await.expect("claim").expect("a stage");
    assert_eq!(next.stage, "publish", "verify waits for publish");
    assert!(sched.claim(None).await.expect("claim").is_none());
    sched.run_claimed(next).await.expect("publish");
    h.run_until_idle(2).await;
    assert_eq!(h.run_state(&run).await, "succeeded");
    let report = h.audit().await;
    assert!(report.is_clean(), "{:#?}", report.violations);
}

async fn after_refused(backend: Backend) {
    let Some((clock, h)) = harness(backend).await else {
        return;
    };
    h.register(&["verify-after-publish"]).await;
    let no_publish = r#"
name = "short"
[[stage]]
name = "draft"
plugin = "draft@^1"
inputs = { topic = "$input" }
[[stage]]
name = "verify"
plugin = "verify@=1.0.0"
inputs = { draft = "draft.draft" }
"#;
    let cycle = r#"
name = "cycle"
[[stage]]
name = "draft"
plugin = "draft@^1"
inputs = { topic = "$input" }
[[stage]]
name = "verify"
plugin = "verify@=1.0.0"
inputs = { draft = "draft.draft" }
[[stage]]
name = "publish"
plugin = "publish@^1"
inputs = { draft = "draft.draft" }
after = ["verify"]
"#;
    let to = semver::Version::new(1, 1, 0);
    for (pipeline, expected) in [
        (no_publish, "which this run does not have"),
        (cycle, "runs after `verify` in this run (a cycle)"),
    ] {
        let run = h.submit(pipeline, b"x").await;
        let refused =
            registry::stage_upgrade(h.store.as_ref(), &run, "verify", &to, clock.as_ref()).await;
        let Err(RegistryError::Refused(reason)) = refused else {
            panic!("refused: {refused:?}");
        };
        assert!(reason.contains(expected), "{reason}");
        let jobs = h.store.job_list(&run).await.expect("jobs");
        let verify = jobs.iter().find(|j| j.stage == "verify").expect("verify");
        assert_eq!(verify.pending, 1, "nothing changed");
    }
}
