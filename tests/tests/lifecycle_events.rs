//! A run's own events, `run.succeeded` and `run.failed`, are written in the
//! transaction that changes its state, and a run's events take their ids
//! in the order its transactions commit (the relay delivers in id order).
//!
//! Seen failing: with the `run.succeeded` insert left out of finishing a
//! run, the event was missing and the audit named it; with PostgreSQL's
//! outbox insert back before the run's lock (as in migration 0006), `b`'s
//! completion committed while an earlier event id of its run was still
//! uncommitted, and the order test failed.

use std::sync::Arc;
use std::time::Duration;

use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::store::{
    EdgeKind, JobBatch, NewEdge, NewJob, OutboxRow, RunSubmit, StageWork,
};
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness, claim, completion, put_stand_in_plugin};

ratchet_tests::backend_tests! {
    a_run_says_how_it_finished_in_the_transaction_that_finished_it => lifecycle_events;
}

async fn lifecycle(h: &Harness, run: &str) -> Vec<OutboxRow> {
    let rows = h.store.outbox_list(Some(run)).await.expect("outbox");
    rows.into_iter().filter(|o| o.stage.is_empty()).collect()
}

async fn lifecycle_events(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    h.register(&["always-fatal"]).await;
    let run = h.submit_demo().await;
    let doomed = h
        .submit(
            &ratchet_tests::one_stage_pipeline("doomed", "always-fatal", ""),
            b"",
        )
        .await;
    h.run_until_idle(2).await;
    h.assert_demo_run_converged(&run).await;

    let succeeded = lifecycle(&h, &run).await;
    assert_eq!(succeeded.len(), 1, "{succeeded:?}");
    let event = &succeeded[0];
    assert_eq!(event.event, "run.succeeded");
    assert_eq!(event.dedup_key, format!("{run}/run.succeeded#1"));
    let payload: serde_json::Value = serde_json::from_str(&event.payload).expect("json");
    assert_eq!(payload["state"], "succeeded");
    assert_eq!(payload["generation"], 1);
    assert!(payload.get("error").is_none(), "{payload}");
    let last_stage_event = h
        .store
        .outbox_list(Some(&run))
        .await
        .expect("outbox")
        .into_iter()
        .filter(|o| !o.stage.is_empty())
        .map(|o| o.id)
        .max();
    assert!(Some(event.id) > last_stage_event, "the run's last event");

    let failed = lifecycle(&h, &doomed).await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].event, "run.failed");
    assert_eq!(failed[0].dedup_key, format!("{doomed}/run.failed#1"));
    let payload: serde_json::Value = serde_json::from_str(&failed[0].payload).expect("json");
    assert_eq!(payload["state"], "failed");
    assert_eq!(payload["failed_stage"], "doomed");
    assert!(
        payload["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{payload}"
    );
    assert!(h.audit().await.is_clean());

    // The audit names a missing lifecycle event and an undeclared one.
    h.raw_sql(&format!(
        "DELETE FROM outbox WHERE run_id = '{doomed}' AND stage = ''"
    ))
    .await;
    let report = h.audit().await;
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.run_id == doomed && v.detail.contains("last lifecycle event is missing")),
        "{:#?}",
        report.violations
    );
    h.raw_sql(&format!(
        "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
         VALUES ('{run}/draft/made.up', '{run}', 'draft', 'made.up', '{{}}', 0)"
    ))
    .await;
    let report = h.audit().await;
    assert!(
        report.violations.iter().any(|v| v
            .detail
            .contains("`made.up` was written, but the stage does not declare it")),
        "{:#?}",
        report.violations
    );
}

/// Two chains of one run, `a` → `c` and `b` → `d`. `a`'s completion is in
/// flight, as the store writes one: its run's row locked, then its event
/// inserted (its id taken), not committed. `b`'s completion must wait for
/// it: committed first, `b`'s event (a later id) would reach the relay
/// while `a`'s earlier one is still invisible, and be delivered first.
/// Neither `a` nor `b` can finish the run (each has a dependent), so before
/// the fix nothing of `b`'s took the run's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_events_take_their_ids_in_the_order_its_transactions_commit() {
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    let now = h.clock.now_ms();
    put_stand_in_plugin(h.store.as_ref(), now).await;
    let job = |stage: &str| NewJob {
        stage: stage.into(),
        work: StageWork::Plugin("p".into()),
        map: None,
        lists: Default::default(),
        outputs: vec!["out".into()],
        emits: vec!["x.done".into()],
        max_attempts: 1,
    };
    let edge = |from: &str, to: &str| NewEdge {
        from_stage: from.into(),
        to_stage: to.into(),
        kind: EdgeKind::After,
    };
    h.store
        .run_submit(RunSubmit {
            run_id: "r".into(),
            pipeline: "chains".into(),
            idempotency_key: None,
            input: Vec::new(),
            jobs: vec![job("a"), job("b"), job("c"), job("d")],
            edges: vec![edge("a", "c"), edge("b", "d")],
            inputs: Vec::new(),
            now,
        })
        .await
        .expect("submit");
    let claimed = claim(h.store.as_ref(), "w", now, 10).await;
    let b = claimed.iter().find(|j| j.stage == "b").expect("b claimed");

    let pool = sqlx::PgPool::connect(&h.url).await.expect("postgres");
    let mut a = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM runs WHERE id = 'r' FOR NO KEY UPDATE")
        .execute(&mut *a)
        .await
        .expect("lock the run");
    let a_id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
         VALUES ('r/a/x.done', 'r', 'a', 'x.done', '{}', 0) RETURNING id",
    )
    .fetch_one(&mut *a)
    .await
    .expect("a's event");

    let batch = JobBatch {
        completions: vec![completion(b, "w", now)],
        claim: None,
    };
    let store = h.store.clone();
    let mut b_done = tokio::spawn(async move { store.job_batch(&batch).await });
    // Waiting on the signal, bounded: `b` must not commit while `a` is open.
    if let Ok(done) = tokio::time::timeout(Duration::from_secs(3), &mut b_done).await {
        panic!("b's completion committed while a's earlier event was uncommitted: {done:?}");
    }
    a.commit().await.expect("a commits");
    b_done.await.expect("b's task").expect("b completes");
    let b_id = h
        .store
        .outbox_list(Some("r"))
        .await
        .expect("outbox")
        .into_iter()
        .find(|o| o.stage == "b")
        .expect("b's event")
        .id;
    assert!(
        a_id < b_id,
        "a committed first, so its id is the lower: {a_id} vs {b_id}"
    );
}
