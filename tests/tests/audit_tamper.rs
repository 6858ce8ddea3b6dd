//! The audit cannot be fooled: each test tampers with a real database that
//! a real worker left clean, in the shape of one broken invariant, and the
//! audit must name it; undone, the audit is clean again.
//!
//! Seen failing before the checks existed (item 5 of #20): every tamper but
//! the unsatisfied edge of a succeeded stage passed as clean.

use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness};

ratchet_tests::backend_tests! {
    the_audit_names_every_tampered_invariant => tampered_invariants_are_named;
}

/// Runs `statement` on the harness's database, outside Ratchet.
async fn tamper(h: &Harness, backend: Backend, statement: &str) {
    let statement = sqlx::AssertSqlSafe(statement.to_string());
    match backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&h.url).await.expect("sqlite");
            sqlx::raw_sql(statement).execute(&pool).await.expect("tamper");
            pool.close().await;
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&h.url).await.expect("postgres");
            sqlx::raw_sql(statement).execute(&pool).await.expect("tamper");
            pool.close().await;
        }
    }
}

/// Tampers, expects a violation containing `expected`, then undoes it and
/// expects a clean audit.
async fn caught(h: &Harness, backend: Backend, tampered: &str, undone: &str, expected: &str) {
    tamper(h, backend, tampered).await;
    let report = h.audit().await;
    assert!(
        report.violations.iter().any(|v| v.detail.contains(expected)),
        "`{tampered}` was not caught as `{expected}`: {:#?}",
        report.violations
    );
    tamper(h, backend, undone).await;
    let report = h.audit().await;
    assert!(report.is_clean(), "after `{undone}`: {:#?}", report.violations);
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
        backend,
        &format!("UPDATE jobs SET state = 'ready' WHERE {}", job("prepare-next")),
        &format!("UPDATE jobs SET state = 'succeeded' WHERE {}", job("prepare-next")),
        "the run is `succeeded`, but this stage is ready",
    )
    .await;
    caught(
        &h,
        backend,
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
        backend,
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
        backend,
        &format!("UPDATE jobs SET attempt = attempt + 1 WHERE {}", job("verify")),
        &format!("UPDATE jobs SET attempt = attempt - 1 WHERE {}", job("verify")),
        "succeeded by attempt 1, but its last attempt is 2",
    )
    .await;
    caught(
        &h,
        backend,
        &format!("UPDATE artifacts SET attempt = 7 WHERE {}", job("verify")),
        &format!("UPDATE artifacts SET attempt = 1 WHERE {}", job("verify")),
        "was stored by attempt 7, but attempt 1 succeeded",
    )
    .await;
    caught(
        &h,
        backend,
        &format!(
            "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
             VALUES ('{doomed}/doomed/x', '{doomed}', 'doomed', 'x', '{{}}', 0)"
        ),
        &format!("DELETE FROM outbox WHERE run_id = '{doomed}'"),
        "outbox event `x` was written, but the stage is dead",
    )
    .await;
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
        backend,
        &format!("UPDATE artifacts SET bytes = {zeroed} WHERE {}", job("draft")),
        &format!("UPDATE artifacts SET bytes = {bytes_back} WHERE {}", job("draft")),
        "no longer hash to its recorded digest",
    )
    .await;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
