//! A claim's cost does not grow with the stages finished before it, and a
//! completion's does not grow with the stages running beside it.
//!
//! On Postgres every state change leaves the old index entry behind until
//! the next vacuum. A claim that chose its jobs through bitmap scans read
//! every entry of `state = 'running'` and `state = 'ready'`, dead ones too,
//! because the queue tables filled up long before autovacuum gathered
//! statistics: per stage, a 10,000-stage fan-out ran twice as slowly as a
//! 1,000-stage one.

use std::sync::Arc;

use ratchet_runtime::bench::fanout_pipeline;
use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::store::{JobClaim, PostgresStore, SqliteStore};
use ratchet_tests::{Backend, Harness};
use serde_json::Value;

/// The plan node named `name` (a `WITH` part is `CTE <name>`).
fn node<'p>(plan: &'p Value, name: &str) -> Option<&'p Value> {
    match plan {
        Value::Object(fields) => {
            if fields.get("Subplan Name").and_then(Value::as_str) == Some(name) {
                return Some(plan);
            }
            fields.values().find_map(|v| node(v, name))
        }
        Value::Array(items) => items.iter().find_map(|v| node(v, name)),
        _ => None,
    }
}

/// The buffers a plan node read, its children included.
fn buffers(node: &Value) -> i64 {
    let count = |key| node.get(key).and_then(Value::as_i64).unwrap_or(0);
    count("Shared Hit Blocks") + count("Shared Read Blocks")
}

/// Every index a plan node or its children scan.
fn indexes(node: &Value, found: &mut Vec<String>) {
    match node {
        Value::Object(fields) => {
            if let Some(index) = fields.get("Index Name").and_then(Value::as_str) {
                found.push(index.to_string());
            }
            fields.values().for_each(|v| indexes(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| indexes(v, found)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choosing_a_job_on_postgres_reads_no_more_after_a_thousand_finished_stages() {
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["pass", "noop"]).await;
    h.submit(&fanout_pipeline(1000), b"finished").await;
    h.run_until_idle(8).await;
    let waiting = h.submit(&fanout_pipeline(20), b"waiting").await;
    assert_eq!(h.run_state(&waiting).await, "running");

    let pg = PostgresStore::open(&h.url).await.expect("open");
    let claim = JobClaim {
        worker: "explain".into(),
        now: h.clock.now_ms(),
        lease_ms: 60_000,
        limit: 1,
        only_job: None,
    };
    let plan = pg.explain_claim(&claim).await.expect("explain the claim");

    // A plan cached while the tables were small, or a bitmap scan, reads
    // the dead entries; the store's connections allow neither.
    let settings = &plan[0]["Settings"];
    assert_eq!(settings["plan_cache_mode"], "force_custom_plan", "{plan:#}");
    assert_eq!(settings["enable_bitmapscan"], "off", "{plan:#}");
    // Expired leases are looked up in an index of running jobs only.
    let expired = node(&plan, "CTE expired").expect("the claim's `expired` part");
    let mut used = Vec::new();
    indexes(expired, &mut used);
    assert_eq!(used, ["jobs_leases"], "{plan:#}");
    // Finding the one job takes a few index pages and its heap page; the
    // 2,000 dead entries of the finished fan-out take a hundred or more.
    let chosen = node(&plan, "CTE chosen").expect("the claim's `chosen` part");
    assert!(
        buffers(chosen) <= 30,
        "choosing 1 of 20 ready jobs read {} buffers after 1,001 finished stages:\n{plan:#}",
        buffers(chosen)
    );
}

/// SQLite's planner walked every running job (`jobs_claimable`, `state =
/// 'running'`) and, for each one, parsed the batch's JSON list of attempts
/// again: with 64 worker tasks a fence took 2.4 ms, a fifth of a fan-out
/// stage's time. The fence must start from the batch and look each job up
/// by its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_a_batch_on_sqlite_looks_up_its_jobs_instead_of_walking_the_running_ones() {
    let h = Harness::new().await;
    h.register(&["pass", "noop"]).await;
    h.submit(&fanout_pipeline(300), b"running").await;
    let sched = h.scheduler("fence", 60_000);
    let running = sched.claim_many(200).await.expect("claim");
    assert_eq!(running.len(), 200);

    let sqlite = SqliteStore::open(&h.url).await.expect("open");
    let plan = sqlite
        .explain_fence("fence", &running[..2])
        .await
        .expect("explain the fence");
    assert!(
        plan.first().is_some_and(|step| step.starts_with("SCAN k")),
        "the fence does not start from the batch's keys: {plan:?}"
    );
    assert!(
        plan.iter()
            .any(|step| step == "SEARCH j USING INTEGER PRIMARY KEY (rowid=?)"),
        "the fence does not look jobs up by id: {plan:?}"
    );
}
