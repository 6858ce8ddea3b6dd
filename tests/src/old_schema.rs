//! Databases as an older Ratchet left them, for tests of migrations.

use ratchet_runtime::store::CompleteOutcome;

use crate::{Backend, Harness, claim, completion, postgres_schema_url, stages};

/// A database of `backend` migrated up to `version` only and holding
/// `rows` (SQL), as a Ratchet of that schema left it: the folder holding it
/// (SQLite) and its URL. `None` when the backend is unavailable here.
pub async fn database_at_version(
    backend: Backend,
    version: i64,
    rows: &str,
) -> Option<(tempfile::TempDir, String)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows = sqlx::AssertSqlSafe(rows.to_string());
    let url = match backend {
        Backend::Sqlite => {
            let path = dir.path().join("old.db");
            sqlite_at_version(&path, version, rows).await;
            format!("sqlite://{}", path.display())
        }
        Backend::Postgres => {
            let url = postgres_schema_url().await?;
            let pool = sqlx::PgPool::connect(&url).await.expect("postgres");
            sqlx::migrate!("../migrations/postgres")
                .run_to(version, &pool)
                .await
                .expect("the schema of an older version");
            sqlx::raw_sql(rows).execute(&pool).await.expect("its rows");
            pool.close().await;
            url
        }
    };
    Some((dir, url))
}

/// A SQLite database at `path` migrated up to `version`, holding `rows`.
pub async fn sqlite_at_version(
    path: &std::path::Path,
    version: i64,
    rows: sqlx::AssertSqlSafe<String>,
) {
    use sqlx::{ConnectOptions, Connection};
    let mut old = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .connect()
        .await
        .expect("create");
    sqlx::migrate!("../migrations/sqlite")
        .run_to(version, &mut old)
        .await
        .expect("the schema of an older version");
    sqlx::raw_sql(rows)
        .execute(&mut old)
        .await
        .expect("its rows");
    old.close().await.expect("close");
}

/// Finishes the run `live` of an old schema's fixture: its stage `a`,
/// leased to `w` before the migration, completes under that lease, then
/// its `b` is claimed and completed, and the run succeeds.
pub async fn finish_live_run(h: &Harness) {
    let now = h.clock.now_ms();
    let leased = h.store.jobs_leased_to("w").await.expect("leases");
    assert_eq!(stages(&leased), [("a", 1)]);
    let done = h.store.job_complete(completion(&leased[0], "w", now)).await;
    assert!(
        matches!(done, Ok(CompleteOutcome::Completed { .. })),
        "{done:?}"
    );
    let b = claim(h.store.as_ref(), "w", now, 8).await;
    assert_eq!(stages(&b), [("b", 1)]);
    h.store
        .job_complete(completion(&b[0], "w", now))
        .await
        .expect("complete b");
    assert_eq!(h.run_state("live").await, "succeeded");
}
