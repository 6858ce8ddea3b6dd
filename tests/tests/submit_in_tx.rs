//! A run submitted inside its caller's transaction (docs/embedding.md): it
//! exists if and only if the caller commits, with the caller's own rows.
//! On PostgreSQL the caller's own `Transaction`; on SQLite a transaction on
//! the store's writer (`SqliteStore::write`).
//!
//! Seen failing with the run written through the store in a transaction of
//! its own (`registry::run_submit`) instead of the caller's: the run and
//! its job were there after the caller rolled back.

use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::plugin::Caps;
use ratchet_runtime::registry::{self, RegistryError};
use ratchet_runtime::store::{CallerTransaction, RunSubmitOutcome, SqliteStore};
use ratchet_tests::{Backend, Harness, one_stage_pipeline};
use sqlx::{Connection, PgConnection, SqliteConnection};

ratchet_tests::backend_tests! {
    a_run_commits_or_rolls_back_with_its_callers_transaction => with_the_caller;
}

/// The caller's orders, after both transactions.
const ORDERS_SQL: &str = "SELECT id FROM orders ORDER BY id";

/// The caller's own write: an order, whose run fulfils it.
async fn order(conn: &mut SqliteConnection, id: &str) -> Result<(), RegistryError> {
    sqlx::query("INSERT INTO orders (id) VALUES (?)")
        .bind(id)
        .execute(conn)
        .await
        .map_err(|e| RegistryError::Refused(e.to_string()))?;
    Ok(())
}

/// Submits a run of `pipeline` keyed `id` in the caller's transaction.
async fn submit_in(
    h: &Harness,
    pipeline: &Pipeline,
    tx: impl CallerTransaction,
    id: &str,
) -> Result<RunSubmitOutcome, RegistryError> {
    let key = Some(id.to_string());
    let (input, caps) = (id.as_bytes().to_vec(), Caps::default());
    registry::run_submit_in(
        h.store.as_ref(),
        tx,
        pipeline,
        input,
        key,
        &caps,
        h.clock.as_ref(),
    )
    .await
}

async fn with_the_caller(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["noop"]).await;
    h.raw_sql("CREATE TABLE orders (id TEXT PRIMARY KEY)").await;
    let pipeline = Pipeline::parse("fulfil.toml", &one_stage_pipeline("fulfil", "noop", ""))
        .expect("pipeline");
    let (kept, orders) = match backend {
        Backend::Postgres => {
            let mut conn = PgConnection::connect(&h.url).await.expect("connect");
            let mut tx = conn.begin().await.expect("begin");
            sqlx::query("INSERT INTO orders (id) VALUES ('dropped')")
                .execute(&mut *tx)
                .await
                .expect("the caller's row");
            submit_in(&h, &pipeline, &mut *tx, "dropped")
                .await
                .expect("submit");
            tx.rollback().await.expect("roll back");

            let mut tx = conn.begin().await.expect("begin");
            sqlx::query("INSERT INTO orders (id) VALUES ('kept')")
                .execute(&mut *tx)
                .await
                .expect("the caller's row");
            let kept = submit_in(&h, &pipeline, &mut *tx, "kept")
                .await
                .expect("submit");
            tx.commit().await.expect("commit");
            let orders: Result<Vec<String>, _> =
                sqlx::query_scalar(ORDERS_SQL).fetch_all(&mut conn).await;
            (kept, orders.expect("orders"))
        }
        Backend::Sqlite => {
            let store = SqliteStore::open(&h.url).await.expect("open");
            let dropped = store
                .write(async |conn: &mut SqliteConnection| {
                    order(conn, "dropped").await?;
                    submit_in(&h, &pipeline, conn, "dropped").await?;
                    Err::<(), _>(RegistryError::Refused("the caller changed its mind".into()))
                })
                .await;
            assert!(dropped.is_err());
            let kept = store
                .write(async |conn: &mut SqliteConnection| {
                    order(conn, "kept").await?;
                    submit_in(&h, &pipeline, conn, "kept").await
                })
                .await
                .expect("submit");
            let mut conn = SqliteConnection::connect(&h.url).await.expect("connect");
            let orders: Result<Vec<String>, _> =
                sqlx::query_scalar(ORDERS_SQL).fetch_all(&mut conn).await;
            (kept, orders.expect("orders"))
        }
    };
    let RunSubmitOutcome::Created(kept) = kept else {
        panic!("a new key made no run: {kept:?}");
    };
    assert_eq!(orders, ["kept"], "the caller's rows go the same way");
    let runs = h.store.run_list().await.expect("runs");
    let keys: Vec<_> = runs.iter().map(|r| r.idempotency_key.as_deref()).collect();
    assert_eq!(keys, [Some("kept")], "only the committed submission stays");
    let jobs = h.store.job_list(&kept).await.expect("jobs");
    assert_eq!(jobs.len(), 1);
    h.run_until_idle(1).await;
    assert_eq!(h.run_state(&kept).await, "succeeded");
    let report = h.audit().await;
    assert!(report.is_clean(), "{:#?}", report.violations);
}
