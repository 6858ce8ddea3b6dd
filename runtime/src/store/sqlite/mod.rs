//! SQLite backend: WAL, `synchronous=FULL`, one writer at a time
//! (`BEGIN IMMEDIATE` on a connection of its own), many readers; each step's
//! rows go to one statement as one JSON array, read with `jsonb_each`.

mod artifacts;
mod audit;
mod bench;
mod checkpoint;
mod complete;
mod control;
mod deliveries;
mod fail;
mod gate;
mod jobs;
mod map;
mod plugins;
mod reconcile;
mod runs;

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Sqlite, SqliteConnection, SqlitePool, Transaction};
use tokio::sync::Mutex;

use super::rows::{self, impl_row_ext, to_json};
use super::*;
pub use checkpoint::CheckpointStats;
use checkpoint::{Checkpointer, WRITER_BACKSTOP_PAGES};

impl_row_ext!(sqlx::sqlite::SqliteRow);

/// Rows a connection's thread reads ahead of the task that takes them.
/// sqlx's default, 50, parks the thread (and wakes it again) every 50 rows
/// of a large read such as the relay's claim of up to a thousand
/// deliveries, a handoff between two threads on the cores the rest of the
/// relay runs on.
const ROW_BUFFER: usize = 1024;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

type Tx<'c> = Transaction<'c, Sqlite>;

/// The embedded store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Readers; WAL lets them run beside the writer.
    pool: SqlitePool,
    /// The one connection that writes, outside the pool. SQLite admits one
    /// writer at a time anyway; writers of this process queue here, in
    /// order, instead of each retrying `BEGIN IMMEDIATE` in SQLite's busy
    /// handler, which sleeps for milliseconds (other processes still meet
    /// the busy timeout). Outside the pool, a transaction does not wait for
    /// the pool to test the connection its predecessor released.
    writer: Arc<Mutex<SqliteConnection>>,
    /// Copies the WAL into the database file beside the writer.
    checkpointer: Arc<Checkpointer>,
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
            .synchronous(SqliteSynchronous::Full)
            // The writer's scratch tables (`WRITER_SCRATCH`) stay in memory.
            .pragma("temp_store", "memory")
            .row_buffer_size(ROW_BUFFER);
        // A SQLite connection is a file handle in this process: there is
        // nothing to test before handing it out.
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(60))
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await?;
        MIGRATOR.run(&pool).await?;
        plugins::backfill_version_keys(&pool).await?;
        let checkpointer = Arc::new(Checkpointer::start(pool.clone()));
        let mut writer = options
            .pragma("wal_autocheckpoint", WRITER_BACKSTOP_PAGES.to_string())
            .connect()
            .await?;
        sqlx::query(WRITER_SCRATCH).execute(&mut writer).await?;
        let writer = Arc::new(Mutex::new(writer));
        Ok(Self {
            pool,
            writer,
            checkpointer,
        })
    }

    /// Commits a write transaction and tells the checkpointer, once the
    /// commit is done (SQLite's commit hook runs before: a checkpoint it
    /// woke could start before the commit's pages were in the WAL).
    async fn commit(&self, tx: Tx<'_>) -> Result<()> {
        tx.commit().await?;
        self.checkpointer.committed();
        Ok(())
    }

    /// Runs `f` in a transaction on the writer and commits it if `f`
    /// returns `Ok` (rolls it back otherwise): for a caller's own statements
    /// and a run submitted with them ([`crate::registry::run_submit_in`]),
    /// which commit together or not at all. It holds the writer while `f`
    /// runs: every other write of this store waits, and other processes
    /// wait on SQLite's lock (docs/embedding.md).
    pub async fn write<T, E: From<StoreError>>(
        &self,
        f: impl AsyncFnOnce(&mut SqliteConnection) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let mut writer = self.writer.lock().await;
        let mut tx = begin_write(&mut writer).await?;
        let value = f(&mut tx).await?;
        self.commit(tx).await?;
        Ok(value)
    }

    /// What the background checkpointer has done, updated as it works.
    pub fn checkpoints(&self) -> tokio::sync::watch::Receiver<CheckpointStats> {
        self.checkpointer.stats()
    }

    /// The writer connection's own checkpoint threshold, in WAL pages.
    pub async fn writer_autocheckpoint(&self) -> Result<i64> {
        let mut writer = self.writer.lock().await;
        Ok(sqlx::query_scalar("PRAGMA wal_autocheckpoint")
            .fetch_one(&mut *writer)
            .await?)
    }
}

/// The writer connection's temporary tables, through which the statements
/// of one call hand rows to each other: the jobs a claim picked
/// (`jobs::claim_tx`), and a batch's document, parsed once into SQLite's
/// binary JSON, and the edges it satisfied (`complete.rs`).
const WRITER_SCRATCH: &str = "
    CREATE TEMP TABLE claim_pick (
        n INTEGER PRIMARY KEY, id INTEGER NOT NULL, attempt INTEGER NOT NULL,
        expired INTEGER NOT NULL);
    CREATE TEMP TABLE batch_doc (doc BLOB NOT NULL);
    CREATE TEMP TABLE satisfied (
        edge INTEGER NOT NULL, run_id TEXT NOT NULL, from_stage TEXT NOT NULL,
        to_stage TEXT NOT NULL)";

/// The condition of the partial index `jobs_live` (migration 0007): SQLite
/// uses a partial index only for a query whose WHERE repeats its condition
/// word for word, so every query of jobs by a live state includes this.
macro_rules! live {
    () => {
        "state IN ('blocked', 'ready', 'running', 'awaiting', 'mapping')"
    };
}
use live;

/// The state a job takes when nothing is left pending: `ready`, unless it
/// is an approval gate (`awaiting` its decision) or maps over a list
/// (`mapping`, expanded or joined in the same transaction, `store::map`).
/// Neither is claimed.
macro_rules! released_state {
    () => {
        "CASE WHEN gate IS NOT NULL THEN 'awaiting' WHEN map_stage IS NOT NULL THEN 'mapping' \
         ELSE 'ready' END"
    };
}
use released_state;

/// A write transaction on the writer connection, taken whole at once, whose
/// commit waits for the disk (`synchronous=FULL`).
async fn begin_write(writer: &mut SqliteConnection) -> Result<Tx<'_>> {
    begin(writer, Durability::Full).await
}

/// How a write transaction's commit reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// It returns once the disk has it (`synchronous=FULL`).
    Full,
    /// It survives the process's death, and the next durable commit makes
    /// it durable too (`synchronous=NORMAL` in WAL mode); only an OS crash
    /// can lose it. For the relay's bookkeeping (ADR 0024), where such a
    /// loss sends an event again under its dedup key.
    Lazy,
}

/// Begins a write transaction on the writer, with the durability its
/// commit is to have set in the same call: each transaction states its
/// own, so none inherits the last one's.
async fn begin(writer: &mut SqliteConnection, durability: Durability) -> Result<Tx<'_>> {
    let statement = match durability {
        Durability::Full => "PRAGMA synchronous = FULL; BEGIN IMMEDIATE",
        Durability::Lazy => "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE",
    };
    Ok(writer.begin_with(statement).await?)
}

super::impl_store!(SqliteStore {});
