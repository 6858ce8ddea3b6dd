//! Durable dependency: an adversarial scheduler that tries to start every
//! dependent as early as it can, and finishes claimed stages in a seeded
//! random order, never gets a stage to run before what it depends on.
//!
//! Checked on the buggy shape: with `after` edges dropped from the plan
//! (manifest/pipeline.rs), `verify` is claimed right after `draft` and the
//! first seed fails.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use ratchet_runtime::store::JobState;
use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness};

ratchet_tests::backend_tests! {
    an_adversarial_scheduler_never_runs_a_stage_before_its_dependencies => adversarial_schedule;
}

/// `verify` is ordered after `publish` by an `after` edge alone: nothing in
/// the data says so. `prepare-next` has both kinds (its plugin's `after` and
/// its `receipt` input).
const PIPELINE: &str = r#"
name = "ordering"

[[stage]]
name = "draft"
plugin = "draft@^1"
inputs = { topic = "$input" }

[[stage]]
name = "verify"
plugin = "verify@^1"
inputs = { draft = "draft.draft" }
after = ["publish"]

[[stage]]
name = "publish"
plugin = "publish@^1"
inputs = { draft = "draft.draft" }

[[stage]]
name = "prepare-next"
plugin = "prepare-next@^1"
inputs = { receipt = "publish.receipt" }
"#;

const SEEDS: u64 = 500;

/// The stages most likely to break ordering come first.
const ADVERSARIAL_ORDER: [&str; 4] = ["prepare-next", "verify", "publish", "draft"];

async fn adversarial_schedule(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let sched = h.scheduler("adversary", 30_000);
    for seed in 0..SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let run = h.submit(PIPELINE, format!("seed {seed}").as_bytes()).await;
        let mut in_flight = Vec::new();
        loop {
            let jobs = h.store.job_list(&run).await.expect("jobs");
            if jobs.iter().all(|j| j.state == JobState::Succeeded) {
                break;
            }
            // Try to start every unfinished stage, dependents first; the store
            // must refuse any whose edges are not all satisfied.
            for stage in ADVERSARIAL_ORDER {
                let job = jobs.iter().find(|j| j.stage == stage).expect("job");
                if job.state == JobState::Succeeded
                    || in_flight
                        .iter()
                        .any(|c: &ratchet_runtime::store::ClaimedJob| c.job_id == job.id)
                {
                    continue;
                }
                if let Some(claimed) = sched.claim(Some(job.id)).await.expect("claim") {
                    in_flight.push(claimed);
                    if rng.random_bool(0.5) {
                        break;
                    }
                }
            }
            assert!(
                !in_flight.is_empty(),
                "seed {seed}: nothing runnable, yet the run is unfinished"
            );
            let pick = rng.random_range(0..in_flight.len());
            let claimed = in_flight.swap_remove(pick);
            let execution = sched.execute(&claimed).await.expect("execute");
            sched.finish(&claimed, &execution).await.expect("finish");
        }

        let jobs = h.store.job_list(&run).await.expect("jobs");
        let attempts = h.store.attempt_list(&run).await.expect("attempts");
        let succeeded_seq = |stage: &str| {
            jobs.iter()
                .find(|j| j.stage == stage)
                .and_then(|j| j.succeeded_seq)
                .expect("succeeded")
        };
        let started_seq = |stage: &str| {
            attempts
                .iter()
                .filter(|a| a.stage == stage)
                .map(|a| a.claim_seq)
                .min()
                .expect("started")
        };
        assert!(
            started_seq("verify") > succeeded_seq("publish"),
            "seed {seed}: verify started before publish committed"
        );
        assert!(
            started_seq("prepare-next") > succeeded_seq("publish"),
            "seed {seed}: prepare-next started before publish committed"
        );
        assert!(
            started_seq("publish") > succeeded_seq("draft"),
            "seed {seed}"
        );
        let draft = h
            .store
            .artifact_get(&run, "draft", "draft")
            .await
            .expect("read")
            .expect("draft");
        let next = h.json(&run, "prepare-next", "next").await;
        assert_eq!(
            next["published_sha256"],
            draft.meta.digest.as_str(),
            "seed {seed}"
        );
    }
    let report = h.audit().await;
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.runs as u64, SEEDS);
}
