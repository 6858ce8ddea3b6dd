//! Scale and chaos: many real worker processes on one database, killed with
//! SIGKILL at random moments and restarted, and a database that drops every
//! connection mid-run. Afterwards nothing is lost, duplicated or stuck.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use ratchet_runtime::clock::SystemClock;
use ratchet_tests::fleet::Fleet;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness, output, ratchet};

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

/// The demo pipeline with a retry budget no chaos schedule can exhaust: a
/// stage claimed and killed five times in a row would otherwise be dead,
/// which is the right outcome in production and noise here.
async fn submit_runs(h: &Harness, n: usize) -> Vec<String> {
    let pipeline = ratchet_runtime::bundled::DEMO_PIPELINE
        .replace("name = \"demo\"", "name = \"demo\"\nmax_attempts = 100");
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        runs.push(
            h.submit(&pipeline, format!("chaos run {i}").as_bytes())
                .await,
        );
    }
    runs
}

/// Runs one `--until-idle` worker to drain what is left, then checks every
/// run and prints the figures.
async fn finish_and_check(h: &Harness, runs: &[String], label: &str, kills: usize) {
    let mut finisher = ratchet(BIN, &h.url);
    finisher.args([
        "worker",
        "--until-idle",
        "--concurrency",
        "4",
        "--lease-ms",
        "500",
    ]);
    let out = output(finisher).await;
    assert!(out.status.success(), "finisher failed: {out:?}");
    let mut attempts = 0;
    let mut retries = 0;
    for run in runs {
        h.assert_demo_run_converged(run).await;
        let rows = h.store.attempt_list(run).await.expect("attempts");
        attempts += rows.len();
        retries += rows.len() - 4;
    }
    let report = h.audit().await;
    let artifacts = report.artifacts;
    println!(
        "{label}: {kills} kills, {} runs, {attempts} attempts, {retries} retries, 0 lost, 0 duplicates, {artifacts} artifacts, audit clean: {}",
        runs.len(),
        report.is_clean()
    );
    assert!(report.is_clean(), "{:#?}", report.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_worker_processes_racing_on_postgres_run_every_stage_once() {
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let runs = submit_runs(&h, 500).await;
    let mut fleet = Fleet::new(BIN, &h.url, &["--until-idle", "--concurrency", "2"]);
    for i in 0..8 {
        fleet.start(i);
    }
    fleet.wait_all().await;
    finish_and_check(&h, &runs, "race on postgres, 8 processes", 0).await;
}

/// Kills a random worker after it reports a random number of finished
/// attempts, restarts it, `kills` times; then drains and checks.
async fn chaos(backend: Backend, workers: usize, runs: usize, kills: usize) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let run_ids = submit_runs(&h, runs).await;
    let mut rng = StdRng::seed_from_u64(7);
    let mut fleet = Fleet::new(BIN, &h.url, &["--concurrency", "2", "--lease-ms", "500"]);
    for i in 0..workers {
        fleet.start(i);
    }
    while fleet.kills < kills {
        // Kill whichever worker reports the k-th finished attempt from now:
        // a random moment, and always a worker that has work in hand.
        let k = rng.random_range(1..=3);
        let mut victim = None;
        for _ in 0..k {
            match tokio::time::timeout(ratchet_tests::BOUND, fleet.progress.recv()).await {
                Ok(Some(p)) => victim = Some(p.index),
                _ => break, // the work ran out
            }
        }
        let Some(victim) = victim else { break };
        fleet.kill(victim).await;
        fleet.start(victim);
    }
    let done = fleet.kills;
    fleet.stop().await;
    assert!(
        done >= kills,
        "only {done} kills happened before the work ran out"
    );
    let label = format!("chaos on {backend:?}, {workers} processes");
    finish_and_check(&h, &run_ids, &label, done).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_worker_processes_on_postgres_lose_nothing() {
    chaos(Backend::Postgres, 4, 120, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_worker_process_on_sqlite_loses_nothing() {
    chaos(Backend::Sqlite, 1, 60, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_survive_postgres_dropping_every_connection_mid_run() {
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let runs = submit_runs(&h, 60).await;
    let (app, admin) = app_and_admin(&h).await;
    let mut fleet = Fleet::new(BIN, &h.url, &["--concurrency", "2", "--lease-ms", "1000"]);
    for i in 0..3 {
        fleet.start(i);
    }
    let mut terminated = 0u64;
    for _ in 0..3 {
        // Let the fleet make some progress, then drop all its connections.
        for _ in 0..10 {
            tokio::time::timeout(ratchet_tests::BOUND, fleet.progress.recv())
                .await
                .expect("progress within the bound");
        }
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&app)
        .fetch_one(&admin)
        .await
        .expect("terminate");
        terminated += n as u64;
    }
    assert!(terminated > 0, "connections were dropped");
    // Every worker is still alive and keeps working after the drops.
    for _ in 0..5 {
        tokio::time::timeout(ratchet_tests::BOUND, fleet.progress.recv())
            .await
            .expect("the fleet kept working after the connections dropped");
    }
    fleet.stop().await;
    finish_and_check(
        &h,
        &runs,
        &format!("postgres dropped {terminated} connections"),
        0,
    )
    .await;
}

/// The application name the harness gives its Postgres connections, and a
/// pool outside it to watch and terminate them.
async fn app_and_admin(h: &Harness) -> (String, sqlx::PgPool) {
    let app = h
        .url
        .split("application_name=")
        .nth(1)
        .expect("the harness names its connections")
        .to_string();
    let admin = sqlx::PgPool::connect(&ratchet_tests::postgres_base_url().expect("url"))
        .await
        .expect("admin");
    (app, admin)
}

/// A worker listens for ready jobs on a connection of its own. The listener
/// outlived its worker, holding that connection and its store's pool open:
/// a process running workers one after another (`ratchet bench`) ran out of
/// Postgres connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_listening_connection_closes_with_the_worker() {
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let (app, admin) = app_and_admin(&h).await;
    let listening = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
             WHERE application_name = $1 AND query ILIKE 'LISTEN%'",
        )
        .bind(&app)
        .fetch_one(&admin)
        .await
        .expect("count listeners");
        n
    };
    for i in 0..3 {
        h.submit(
            ratchet_runtime::bundled::DEMO_PIPELINE,
            format!("run {i}").as_bytes(),
        )
        .await;
        h.run_until_idle(2).await;
    }
    // A closed connection's backend ends on its own time: look again until
    // it has, within the bound.
    let left = tokio::time::timeout(ratchet_tests::BOUND, async {
        loop {
            let n = listening().await;
            if n == 0 {
                return n;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(left, Ok(0), "listeners still open: {}", listening().await);
}
