//! PostgreSQL backend: many worker processes on many hosts share one
//! database. Claims skip locked rows, fencing is the same as on SQLite, and
//! workers wake through `LISTEN/NOTIFY` on `ratchet_ready`.

mod artifacts;
mod audit;
mod bench;
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
mod vacuum;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::Notify;

use super::rows::{self, impl_row_ext, to_json};
use super::*;

impl_row_ext!(sqlx::postgres::PgRow);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// Planner settings of every connection (ADR 0009). The queue tables go
/// from empty to thousands of rows in seconds, long before autovacuum
/// gathers statistics, and every state change leaves a dead index entry
/// behind until the next vacuum:
/// - a generic plan, cached after five executions while the tables were
///   still small, is never revisited; each execution is planned for the
///   rows there are now instead;
/// - a bitmap scan reads every index entry in its range, dead ones too, and
///   sorts them all to return the first few, where an index scan in the
///   index's order stops at the `LIMIT` and marks the dead entries it passes
///   so that no later scan reads them. Statistics that undercount the ready
///   jobs made the planner prefer bitmap scans, and a claim's cost grew with
///   the stages finished.
const PLANNER_SETTINGS: [(&str, &str); 2] = [
    ("plan_cache_mode", "force_custom_plan"),
    ("enable_bitmapscan", "off"),
];

/// The channel a transaction notifies when it made a job ready.
const READY_CHANNEL: &str = "ratchet_ready";

/// The channel a transaction notifies, with a run's id, when it may have
/// ended the run.
const ENDED_CHANNEL: &str = "ratchet_run_ended";

type Tx = Transaction<'static, Postgres>;

type PgQuery<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

/// One column of a set of rows, bound as one array parameter.
/// The state a job takes when nothing is left pending: `ready`, unless it
/// is an approval gate (`awaiting` its decision) or maps over a list
/// (`mapping`, expanded or joined in the same transaction, `store::map`).
/// Neither is claimed. Migration 0017's `ratchet_success_and_release` says
/// the same.
macro_rules! released_state {
    () => {
        "CASE WHEN gate IS NOT NULL THEN 'awaiting' WHEN map_stage IS NOT NULL THEN 'mapping' \
         ELSE 'ready' END"
    };
}
use released_state;

fn column<'r, T, U>(rows: &'r [T], f: impl Fn(&'r T) -> U) -> Vec<U> {
    rows.iter().map(f).collect()
}

#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// Batches written step by step because one call could not take them.
    stepped: Arc<AtomicU64>,
}

impl PostgresStore {
    /// Connects to `postgres://…` and migrates the schema. The pool
    /// reconnects by itself after a connection or server restart.
    pub async fn open(url: &str) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|_| StoreError::UnsupportedUrl(url.to_string()))?
            .options(PLANNER_SETTINGS);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        plugins::backfill_version_keys(&pool).await?;
        Ok(Self {
            pool,
            stepped: Arc::default(),
        })
    }

    /// How many batches of completions this store wrote statement by
    /// statement: those with an attempt fenced out or a proposal that lost
    /// to a stored artifact, which one call of `ratchet_complete_batch`
    /// does not take (ADR 0010).
    pub fn batches_in_steps(&self) -> u64 {
        self.stepped.load(Ordering::Relaxed)
    }

    async fn begin_write(&self) -> Result<Tx> {
        Ok(self.pool.begin().await?)
    }
}

/// What `statement`, with the parameters `bind` gives it, does on the data
/// there is now, as `EXPLAIN (ANALYZE, BUFFERS, SETTINGS, FORMAT JSON)`
/// prints it. It runs in a transaction rolled back after: nothing changes.
/// For diagnosing slow claims.
async fn explained<'q>(
    store: &PostgresStore,
    statement: &str,
    bind: impl FnOnce(PgQuery<'q>) -> PgQuery<'q>,
) -> Result<serde_json::Value> {
    let sql = format!("EXPLAIN (ANALYZE, BUFFERS, SETTINGS, FORMAT JSON) {statement}");
    let mut tx = store.begin_write().await?;
    let row = bind(sqlx::query(sqlx::AssertSqlSafe(sql)))
        .fetch_one(&mut *tx)
        .await?;
    tx.rollback().await?;
    // The plan is `json`, sent as its text.
    let text: String = sqlx::Row::try_get_unchecked(&row, 0)?;
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
        table: "EXPLAIN",
        detail: format!("the plan is not JSON: {e}"),
    })
}

async fn notify_ready<'e>(ex: impl sqlx::Executor<'e, Database = Postgres>) -> Result<()> {
    announce(ex, true, &[] as &[&str]).await
}

/// Notifies [`READY_CHANNEL`] if `ready`, and [`ENDED_CHANNEL`] once for
/// each run of `ended`, in one statement.
async fn announce<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    ready: bool,
    ended: &[impl AsRef<str>],
) -> Result<()> {
    let mut channels = Vec::with_capacity(ended.len() + 1);
    let mut payloads = Vec::with_capacity(ended.len() + 1);
    if ready {
        channels.push(READY_CHANNEL);
        payloads.push("");
    }
    for run in ended {
        channels.push(ENDED_CHANNEL);
        payloads.push(run.as_ref());
    }
    if channels.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify(c, p) FROM UNNEST($1::TEXT[], $2::TEXT[]) AS n(c, p)")
        .bind(channels)
        .bind(payloads)
        .execute(ex)
        .await?;
    Ok(())
}

/// Calls `on` with each notification's payload on `channel`, and with
/// `None` whenever listening (re)starts: a notification sent while no one
/// listened is lost, so everything must be read again.
fn listen(pool: PgPool, channel: &'static str, on: RunEnded) -> Listening {
    Listening::task(tokio::spawn(async move {
        loop {
            let listened = async {
                let mut listener = PgListener::connect_with(&pool).await?;
                listener.listen(channel).await?;
                on(None);
                loop {
                    let notification = listener.recv().await?;
                    on(Some(notification.payload()));
                }
                #[allow(unreachable_code)]
                Ok::<(), sqlx::Error>(())
            };
            if let Err(e) = listened.await {
                tracing::warn!("LISTEN {channel} failed, reconnecting: {e}");
            }
            on(None);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }))
}

super::impl_store!(PostgresStore {
    /// Transactions on different rows commit in parallel: two in flight
    /// hide each one's round trip and flush. More split the completions
    /// into smaller batches, and each batch's call costs the server about
    /// the same whatever its size (ADR 0010).
    fn write_concurrency(&self) -> usize {
        2
    }

    async fn jobs_vacuum(&self) -> Result<JobsVacuum> {
        vacuum::jobs(self).await
    }

    fn listen_ready(&self, wake: Arc<Notify>) -> Listening {
        listen(self.pool.clone(), READY_CHANNEL, Box::new(move |_| wake.notify_waiters()))
    }

    fn listen_ended(&self, on: RunEnded) -> Listening {
        listen(self.pool.clone(), ENDED_CHANNEL, on)
    }
});
