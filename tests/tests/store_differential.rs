//! Differential: one seeded random sequence of submits, claims,
//! completions, failures, lease expiries and reconciles, applied to SQLite
//! and to Postgres, must leave the same final state.
//!
//! Checked on a buggy shape: with the Postgres claim ordered `id DESC`, the
//! first seed fails at the first claim that has a choice.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::store::{
    ClaimedJob, EdgeKind, InputBinding, JobClaim, JobComplete, JobFail, NewEdge, NewJob, Payload,
    RunSubmit, StageWork, Store,
};
use ratchet_tests::{Backend, Harness};
use serde_json::{Value, json};

const SEEDS: u64 = 5;
const STEPS: usize = 300;

fn submit(n: usize, now: i64) -> RunSubmit {
    let job = |stage: &str| NewJob {
        stage: stage.into(),
        work: StageWork::Plugin("p".into()),
        map: None,
        lists: Default::default(),
        outputs: vec!["out".into()],
        emits: if stage == "b" {
            vec!["b.done".into()]
        } else {
            vec![]
        },
        max_attempts: 3,
    };
    let edge = |from: &str, to: &str, kind| NewEdge {
        from_stage: from.into(),
        to_stage: to.into(),
        kind,
    };
    let bind = |stage: &str, from: &str| InputBinding {
        stage: stage.into(),
        input: "in".into(),
        from_stage: from.into(),
        from_output: "out".into(),
    };
    RunSubmit {
        run_id: format!("run-{n:03}"),
        pipeline: "diamond".into(),
        // Every fourth submission repeats the previous key.
        idempotency_key: Some(format!("key-{}", if n % 4 == 3 { n - 1 } else { n })),
        input: format!("input {n}").into_bytes(),
        jobs: vec![job("a"), job("b"), job("c"), job("d")],
        edges: vec![
            edge("a", "b", EdgeKind::Data),
            edge("a", "c", EdgeKind::Data),
            edge("b", "d", EdgeKind::Data),
            edge("c", "d", EdgeKind::After),
        ],
        inputs: vec![bind("b", "a"), bind("c", "a"), bind("d", "b")],
        now,
    }
}

/// Applies the seed's operations and returns everything the store holds.
async fn apply(store: &dyn Store, seed: u64) -> Value {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now = 1_000_000i64;
    let mut runs = 0;
    let mut in_flight: Vec<(ClaimedJob, String)> = Vec::new();
    ratchet_tests::put_stand_in_plugin(store, now).await;
    let mut log = Vec::new();
    for step in 0..STEPS {
        match rng.random_range(0..12) {
            0..=1 => {
                let outcome = store.run_submit(submit(runs, now)).await.expect("submit");
                runs += 1;
                log.push(json!(["submit", outcome.run_id()]));
            }
            2..=5 => {
                let worker = format!("w{}", rng.random_range(0..3));
                let claim = JobClaim {
                    worker: worker.clone(),
                    now,
                    lease_ms: 1_000,
                    limit: rng.random_range(1..=3),
                    only_job: None,
                    caps: Default::default(),
                };
                let claimed = store.job_claim(claim).await.expect("claim");
                let ids: Vec<_> = claimed.iter().map(|c| (c.job_id, c.attempt)).collect();
                log.push(json!(["claim", ids]));
                in_flight.extend(claimed.into_iter().map(|c| (c, worker.clone())));
            }
            6..=8 if !in_flight.is_empty() => {
                // A group commit of up to three attempts, zombies included.
                let mut batch = Vec::new();
                for _ in 0..rng.random_range(1..=3usize).min(in_flight.len()) {
                    let (job, worker) = in_flight.swap_remove(rng.random_range(0..in_flight.len()));
                    let bytes = format!("seed {seed} step {step} job {}", job.job_id).into_bytes();
                    batch.push(JobComplete {
                        job_id: job.job_id,
                        attempt: job.attempt,
                        worker,
                        job: (&job).into(),
                        outputs: vec![Payload::new("out", "text/plain", bytes)],
                        input_digests: BTreeMap::new(),
                        now,
                    });
                }
                let outcomes = store.job_complete_many(&batch).await.expect("complete");
                log.push(json!(["complete", format!("{outcomes:?}")]));
            }
            9 if !in_flight.is_empty() => {
                let (job, worker) = in_flight.swap_remove(rng.random_range(0..in_flight.len()));
                let fail = JobFail {
                    job_id: job.job_id,
                    attempt: job.attempt,
                    worker,
                    error: format!("failure at step {step}"),
                    retryable: rng.random_bool(0.8),
                    retry_at: now + 500,
                    input_digests: BTreeMap::new(),
                    now,
                };
                let outcome = store.job_fail(fail).await.expect("fail");
                log.push(json!(["fail", format!("{outcome:?}")]));
            }
            _ => {
                now += rng.random_range(0..1_500);
                let report = store.reconcile(now).await.expect("reconcile");
                log.push(json!(["reconcile", report]));
            }
        }
    }
    let mut state = BTreeMap::new();
    for run in store.run_list().await.expect("runs") {
        let id = run.id.clone();
        // What a claim saw of its edges is recorded by PostgreSQL alone
        // (ADR 0018).
        let mut attempts = store.attempt_list(&id).await.expect("attempts");
        for a in &mut attempts {
            a.deps_seen = None;
        }
        state.insert(
            id.clone(),
            json!({
                "run": run,
                "jobs": store.job_list(&id).await.expect("jobs"),
                "artifacts": store.artifact_list(&id).await.expect("artifacts"),
                "attempts": attempts,
                "outbox": store.outbox_list(Some(&id)).await.expect("outbox"),
            }),
        );
    }
    json!({ "log": log, "state": state })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_operations_leave_the_same_state_on_sqlite_and_postgres() {
    for seed in 0..SEEDS {
        let Some(pg) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
            return;
        };
        let sqlite = Harness::on(Backend::Sqlite, Arc::new(SystemClock))
            .await
            .expect("sqlite");
        let on_sqlite = apply(sqlite.store.as_ref(), seed).await;
        let on_postgres = apply(pg.store.as_ref(), seed).await;
        let runs = on_sqlite["state"].as_object().map(|m| m.len()).unwrap_or(0);
        assert!(
            runs > 10,
            "seed {seed}: the sequence should exercise many runs ({runs})"
        );
        for (i, (a, b)) in on_sqlite["log"]
            .as_array()
            .expect("log")
            .iter()
            .zip(on_postgres["log"].as_array().expect("log"))
            .enumerate()
        {
            assert_eq!(a, b, "seed {seed}: operation {i} answered differently");
        }
        assert_eq!(
            on_sqlite["state"], on_postgres["state"],
            "seed {seed}: final states differ"
        );
    }
}
