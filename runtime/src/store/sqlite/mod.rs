//! SQLite backend: WAL, `synchronous=FULL`, one writer at a time
//! (`BEGIN IMMEDIATE`), many readers.

mod artifacts;
mod audit;
mod bench;
mod complete;
mod jobs;
mod plugins;
mod runs;

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::rows::{self, impl_row_ext, repin_refusal, to_json};
use super::*;

impl_row_ext!(sqlx::sqlite::SqliteRow);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

type Tx = Transaction<'static, Sqlite>;

/// The embedded store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `sqlite://PATH` and
    /// migrates it; every commit is durable (`synchronous=FULL`).
    pub async fn open(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|_| StoreError::UnsupportedUrl(url.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true)
            .synchronous(SqliteSynchronous::Full);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(Self { pool })
    }

    async fn begin_write(&self) -> Result<Tx> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }
}

/// Next value of the global order shared by claims and completions.
async fn next_seq(tx: &mut Tx) -> Result<i64> {
    let seq: i64 = sqlx::query_scalar(
        "UPDATE counters SET value = value + 1 WHERE name = 'seq' RETURNING value",
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(seq)
}

super::impl_store!(SqliteStore {});
