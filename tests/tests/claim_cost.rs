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
use std::time::Duration;

use ratchet_bench::fanout_pipeline;
use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::scheduler::{Scheduler, SchedulerConfig};
use ratchet_runtime::store::{JobClaim, JobsVacuum, PostgresStore, Queue, SqliteStore};
use ratchet_runtime::worker::{self, WorkerOptions};
use ratchet_tests::{BOUND, Backend, Harness};
use serde_json::Value;

/// The Postgres tests of this file, one at a time: a burn-down running
/// beside a claim holds back the horizon below which the claim may mark
/// dead entries as such, and the claim then reads more (37 buffers instead
/// of at most 30, seen).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["pass", "noop"]).await;
    h.submit(&fanout_pipeline(1000), b"finished").await;
    h.run_until_idle(8).await;
    let waiting = h.submit(&fanout_pipeline(20), b"waiting").await;
    assert_eq!(h.run_state(&waiting).await, "running");

    let pg = PostgresStore::open(&h.url).await.expect("open");
    let plan = explain_choosing_one(&pg, &h).await;

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

/// The plan of a claim of 1 job, run and rolled back.
async fn explain_choosing_one(pg: &PostgresStore, h: &Harness) -> Value {
    let claim = JobClaim {
        worker: "explain".into(),
        now: h.clock.now_ms(),
        lease_ms: 60_000,
        limit: 1,
        only_job: None,
        caps: Default::default(),
    };
    pg.explain_claim(&claim).await.expect("explain the claim")
}

/// The buffers the claim's `chosen` part reads to take 1 job.
async fn buffers_to_choose_one(pg: &PostgresStore, h: &Harness) -> i64 {
    let plan = explain_choosing_one(pg, h).await;
    buffers(node(&plan, "CTE chosen").expect("the claim's `chosen` part"))
}

/// A burn-down leaves each claimed job's old entry at the head of the
/// `ready` range of `jobs_claimable`, where every claim starts reading,
/// until a vacuum: at 97 % of a 100,000-stage run a claim read 481 buffers
/// for 18 jobs, and a stage took three times as long as at 10,000
/// (BENCHMARKS.md). A worker vacuums the queue once the server counts
/// enough dead row versions (ADR 0019); this worker never does during its
/// run, so the test's own call meets the pile.
///
/// Seen failing without the vacuum (`jobs_vacuum` answering "due" without
/// running it): the claim read 105 buffers after it, as before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vacuumed_queue_chooses_a_job_without_walking_the_claimed_ones() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["pass", "noop"]).await;
    h.submit(&fanout_pipeline(20_000), b"finished").await;
    let opts = WorkerOptions {
        concurrency: 16,
        until_idle: true,
        poll: Duration::from_millis(20),
        vacuum_every: Duration::from_secs(3_600),
        ..WorkerOptions::default()
    };
    // A store of its own, so that the statistics of every connection that
    // did the burn-down's work can be flushed before they are read.
    let pg = Arc::new(PostgresStore::open(&h.url).await.expect("open"));
    let mut config = SchedulerConfig::new("no-vacuum");
    config.lease_ms = 30_000;
    let sched = Arc::new(Scheduler::new(
        pg.clone(),
        h.host.clone(),
        h.clock.clone(),
        config,
    ));
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::time::timeout(
        BOUND,
        worker::run(pg.clone(), sched, h.clock.clone(), opts, stopped),
    )
    .await
    .expect("the burn-down ended within the bound")
    .expect("the worker ran");
    h.submit(&fanout_pipeline(20), b"waiting").await;
    let before = buffers_to_choose_one(&pg, &h).await;

    pg.statistics_flush().await.expect("flush the statistics");
    assert_eq!(
        pg.jobs_vacuum().await.expect("vacuum"),
        JobsVacuum::Vacuumed,
        "20,000 claimed stages did not make a vacuum due"
    );
    let after = buffers_to_choose_one(&pg, &h).await;
    assert!(
        after <= 30,
        "choosing 1 of 20 ready jobs read {after} buffers after the vacuum ({before} before)"
    );
    println!("choosing 1 job: {before} buffers before the vacuum, {after} after");
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

/// A role that does not own `jobs` may not vacuum it: PostgreSQL skips the
/// table with a warning and reports success, so a worker used to say it
/// vacuumed, and the server warned again every second while the dead rows
/// stayed many. The store must say the vacuum is not permitted (the
/// worker then tells the operator once and asks again a minute later).
///
/// Seen failing before the permission check: `jobs_vacuum` answered that
/// it vacuumed, and the dead row versions were all still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_does_not_own_the_queue_is_told_it_may_not_vacuum_it() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["pass", "noop"]).await;
    h.submit(&fanout_pipeline(10_000), b"dead rows").await;
    let schema = h
        .url
        .split("search_path%3D")
        .nth(1)
        .and_then(|rest| rest.split('&').next())
        .expect("the harness's schema");
    // Every job row updated once: 10,002 dead row versions, flushed to the
    // server's statistics as the connection goes idle.
    h.raw_sql(&format!(
        "DO $$ BEGIN CREATE ROLE ratchet_not_owner LOGIN;
               EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT USAGE, CREATE ON SCHEMA {schema} TO ratchet_not_owner;
         GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO ratchet_not_owner;
         GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO ratchet_not_owner;
         UPDATE jobs SET next_run_at = next_run_at;
         SELECT pg_stat_force_next_flush();"
    ))
    .await;
    let url = h.url.replacen("://postgres@", "://ratchet_not_owner@", 1);
    assert_ne!(url, h.url, "the test server's user is `postgres`");
    let guest = PostgresStore::open(&url)
        .await
        .expect("open as another role");
    match guest.jobs_vacuum().await.expect("ask for a vacuum") {
        JobsVacuum::NotPermitted(why) => {
            assert!(
                why.contains("ratchet_not_owner") && why.contains("does not own"),
                "{why}"
            );
        }
        other => panic!("a role that does not own `jobs` was answered {other:?}"),
    }
    // The owner may.
    let owner = PostgresStore::open(&h.url)
        .await
        .expect("open as the owner");
    assert_eq!(
        owner.jobs_vacuum().await.expect("vacuum"),
        JobsVacuum::Vacuumed
    );
}
