//! The audit cannot be fooled: each test tampers with a real database that
//! a real worker left clean, in the shape of one broken invariant, and the
//! audit must name it; undone, the audit is clean again.
//!
//! Seen failing before the checks existed (item 5 of #20): every tamper but
//! the unsatisfied edge of a succeeded stage passed as clean.
//!
//! On PostgreSQL, a constructed interleaving shows why the claim's sequence
//! value cannot be trusted to follow its predecessor's commit, and that the
//! audit now catches it (item 7, ADR 0018).

use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::operator;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness};

ratchet_tests::backend_tests! {
    the_audit_names_every_tampered_invariant => tampered_invariants_are_named;
}

/// Tampers, expects a violation containing `expected`, then undoes it and
/// expects a clean audit.
async fn caught(h: &Harness, tampered: &str, undone: &str, expected: &str) {
    h.raw_sql(tampered).await;
    let report = h.audit().await;
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.detail.contains(expected)),
        "`{tampered}` was not caught as `{expected}`: {:#?}",
        report.violations
    );
    h.raw_sql(undone).await;
    let report = h.audit().await;
    assert!(
        report.is_clean(),
        "after `{undone}`: {:#?}",
        report.violations
    );
}

async fn tampered_invariants_are_named(backend: Backend) {
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
    let job = |stage: &str| format!("run_id = '{run}' AND stage = '{stage}'");

    caught(
        &h,
        &format!(
            "UPDATE jobs SET state = 'ready' WHERE {}",
            job("prepare-next")
        ),
        &format!(
            "UPDATE jobs SET state = 'succeeded' WHERE {}",
            job("prepare-next")
        ),
        "the run is `succeeded`, but this stage is ready",
    )
    .await;
    caught(
        &h,
        &format!(
            "UPDATE edges SET satisfied = 0 WHERE {}",
            job("verify").replace("stage", "to_stage")
        ),
        &format!(
            "UPDATE edges SET satisfied = 1 WHERE {}",
            job("verify").replace("stage", "to_stage")
        ),
        "never satisfied",
    )
    .await;
    caught(
        &h,
        &format!(
            "UPDATE jobs SET state = 'ready' WHERE {}; UPDATE edges SET satisfied = 0 WHERE {}",
            job("verify"),
            job("verify").replace("stage", "to_stage")
        ),
        &format!(
            "UPDATE jobs SET state = 'succeeded' WHERE {}; UPDATE edges SET satisfied = 1 WHERE {}",
            job("verify"),
            job("verify").replace("stage", "to_stage")
        ),
        "ready, but 1 incoming edges are unsatisfied",
    )
    .await;
    caught(
        &h,
        &format!(
            "UPDATE jobs SET attempt = attempt + 1 WHERE {}",
            job("verify")
        ),
        &format!(
            "UPDATE jobs SET attempt = attempt - 1 WHERE {}",
            job("verify")
        ),
        "succeeded by attempt 1, but its last attempt is 2",
    )
    .await;
    caught(
        &h,
        &format!("UPDATE artifacts SET attempt = 7 WHERE {}", job("verify")),
        &format!("UPDATE artifacts SET attempt = 1 WHERE {}", job("verify")),
        "was stored by attempt 7, but attempt 1 succeeded",
    )
    .await;
    caught(
        &h,
        &format!(
            "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
             VALUES ('{doomed}/doomed/x', '{doomed}', 'doomed', 'x', '{{}}', 0)"
        ),
        &format!("DELETE FROM outbox WHERE run_id = '{doomed}' AND stage = 'doomed'"),
        "outbox event `x` was written, but the stage is dead",
    )
    .await;
    caught(
        &h,
        &format!("UPDATE attempts SET claim_seq = claim_seq + 1000000 WHERE run_id = '{doomed}'"),
        &format!("UPDATE attempts SET claim_seq = claim_seq - 1000000 WHERE run_id = '{doomed}'"),
        "after the run failed",
    )
    .await;
    // A delivery whose event is gone. Only PostgreSQL can hold one: SQLite
    // keeps the foreign key that PostgreSQL dropped (migration 0023), whose
    // guard the audit now is. Seen failing with the audit's check of the
    // event left out: the delivery passed as clean.
    if backend == Backend::Postgres {
        caught(
            &h,
            &format!(
                "INSERT INTO deliveries (outbox_id, sink, run_id, state, next_at, retrying_since,
                                         created_at)
                 VALUES (-1, 'hooks', '{run}', 'pending', 0, 0, 0)"
            ),
            "DELETE FROM deliveries WHERE outbox_id = -1",
            "names event -1, which is not in the outbox",
        )
        .await;
        // PostgreSQL's dead letters are listed in a table of their own too
        // (migration 0028), and the two must agree. Seen failing with the
        // audit's check of that table left out: both passed as clean.
        caught(
            &h,
            &format!(
                "INSERT INTO deliveries (outbox_id, sink, run_id, state, next_at, retrying_since,
                                         created_at)
                 SELECT min(id), 'tampered', '{run}', 'dead', 0, 0, 0 FROM outbox
                 WHERE run_id = '{run}'"
            ),
            "DELETE FROM deliveries WHERE sink = 'tampered'",
            "is dead but not among the dead letters",
        )
        .await;
        caught(
            &h,
            "INSERT INTO dead_deliveries (id, sink) VALUES (-7, 'hooks')",
            "DELETE FROM dead_deliveries WHERE id = -7",
            "list delivery -7 to sink `hooks`, whose state is gone",
        )
        .await;
    }
    let zeroed = match backend {
        Backend::Sqlite => "X'00'",
        Backend::Postgres => "'\\x00'::BYTEA",
    };
    let draft = h
        .store
        .artifact_get(&run, "draft", "draft")
        .await
        .expect("read")
        .expect("draft");
    let bytes_back = match backend {
        Backend::Sqlite => format!("X'{}'", hex(&draft.bytes)),
        Backend::Postgres => format!("'\\x{}'::BYTEA", hex(&draft.bytes)),
    };
    caught(
        &h,
        &format!(
            "UPDATE artifacts SET bytes = {zeroed} WHERE {}",
            job("draft")
        ),
        &format!(
            "UPDATE artifacts SET bytes = {bytes_back} WHERE {}",
            job("draft")
        ),
        "no longer hash to its recorded digest",
    )
    .await;
    // Retried, then failed again: nothing may start after the new failure
    // either. Seen failing with the check skipped for every run an operator
    // had retried once.
    operator::run_retry(
        h.store.as_ref(),
        &doomed,
        None,
        false,
        "op".into(),
        h.clock.as_ref(),
    )
    .await
    .expect("retry");
    h.run_until_idle(2).await;
    assert_eq!(h.run_state(&doomed).await, "failed");
    caught(
        &h,
        &format!("UPDATE attempts SET claim_seq = claim_seq + 1000000 WHERE run_id = '{doomed}'"),
        &format!("UPDATE attempts SET claim_seq = claim_seq - 1000000 WHERE run_id = '{doomed}'"),
        "after the run failed",
    )
    .await;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Item 7 of #20. `a`'s completion takes its sequence value and is still
/// open when `b` is released early (the bug an audit must catch) and
/// claimed: `b`'s claim value is the later one although `a` commits after
/// it. Seen failing before the fix: the audit compared sequence values
/// only and reported the run clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_before_its_predecessor_committed_is_caught_whatever_the_sequence_says() {
    let Some(h) = Harness::on(Backend::Postgres, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["noop", "pass"]).await;
    let run = h.submit(ratchet_tests::TWO_STAGES, b"").await;
    let sched = h.scheduler("worker", 30_000);
    sched.claim(None).await.expect("claim").expect("a");
    let pool = sqlx::PgPool::connect(&h.url).await.expect("postgres");
    // `a`'s completion, in flight: its sequence value taken, not committed.
    let mut completing = pool.begin().await.expect("begin");
    sqlx::query(
        "UPDATE jobs SET state = 'succeeded', succeeded_seq = nextval('ratchet_seq')
         WHERE run_id = $1 AND stage = 'a'",
    )
    .bind(&run)
    .execute(&mut *completing)
    .await
    .expect("a succeeds");
    sqlx::query("UPDATE edges SET satisfied = 1 WHERE run_id = $1 AND from_stage = 'a'")
        .bind(&run)
        .execute(&mut *completing)
        .await
        .expect("edge satisfied");
    // The bug: `b` released before `a` committed, and claimed.
    sqlx::query("UPDATE jobs SET state = 'ready', pending = 0 WHERE run_id = $1 AND stage = 'b'")
        .bind(&run)
        .execute(&pool)
        .await
        .expect("released early");
    let b = sched.claim(None).await.expect("claim").expect("b");
    assert_eq!(b.stage, "b");
    completing
        .commit()
        .await
        .expect("a commits after b's claim");
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    let a_seq = jobs[0].succeeded_seq.expect("a's value");
    assert!(
        a_seq < attempts[1].claim_seq,
        "the sequence says a came first: {a_seq} < {}",
        attempts[1].claim_seq
    );
    let report = h.audit().await;
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.stage == "b" && v.detail.contains("claimed when 0 of its 1 dependencies")),
        "{:#?}",
        report.violations
    );
}
