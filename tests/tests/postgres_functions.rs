//! PostgreSQL's completion functions (migration 0006) restate a rule the
//! Rust code holds: a run has succeeded when no job of it is in any state
//! but `succeeded`, which `ratchet_finish_runs` writes as a list of the
//! other states (so the `(run_id, state)` index is used). Applied
//! migrations are checksummed, so a change to the rule arrives as a new
//! migration; this test pins the function, as the server holds it, to
//! `JobState::ALL`.
//!
//! Seen failing with a state added to `JobState::ALL` that the function
//! does not list (a run would finish with that job unfinished).

use std::collections::BTreeSet;
use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::store::JobState;
use ratchet_tests::{Backend, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_finished_rule_lists_every_state_but_succeeded() {
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    let pool = sqlx::PgPool::connect(&h.url).await.expect("postgres");
    let definition: String =
        sqlx::query_scalar("SELECT pg_get_functiondef('ratchet_finish_runs'::regproc)")
            .fetch_one(&pool)
            .await
            .expect("the function");
    let listed = definition
        .split_once("j.state IN (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(list, _)| list)
        .expect("the function lists job states");
    let listed: BTreeSet<&str> = listed
        .split(',')
        .map(|s| s.trim().trim_matches('\''))
        .collect();
    let unfinished: BTreeSet<&str> = JobState::ALL
        .iter()
        .filter(|s| **s != JobState::Succeeded)
        .map(|s| s.as_str())
        .collect();
    assert_eq!(listed, unfinished, "{definition}");
}
