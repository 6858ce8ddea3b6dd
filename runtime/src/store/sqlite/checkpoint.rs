//! The WAL is copied back into the database file by a task of its own, on a
//! reader connection, instead of by whichever commit crosses SQLite's
//! threshold: that commit stalled every completion of its batch for the
//! few milliseconds a checkpoint takes (ADR 0015).

use std::sync::Arc;
use std::time::Duration;

use sqlx::SqlitePool;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// How long commits accumulate before the checkpointer copies them: one
/// checkpoint writes a page changed by many commits once.
const COALESCE: Duration = Duration::from_millis(50);

/// The writer still checkpoints by itself once the WAL holds this many
/// pages (SQLite's default is 1,000). That bounds the WAL: under steady
/// load commits land while the checkpointer copies, so the WAL never starts
/// over from its beginning after one of its checkpoints. By then the
/// checkpointer has copied nearly all of it, so the writer's own checkpoint
/// is short, and the writer's next transaction starts the WAL over. It is
/// also the backstop for a process that exits before its checkpointer ran.
pub(super) const WRITER_BACKSTOP_PAGES: u32 = 10_000;

/// What the checkpointer has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Checkpoints run.
    pub runs: u64,
    /// Pages in the WAL, and how many of them were in the database file
    /// once the last checkpoint ended.
    pub wal_pages: i64,
    pub checkpointed_pages: i64,
}

/// The task, stopped when the store's last handle is dropped.
#[derive(Debug)]
pub(super) struct Checkpointer {
    task: JoinHandle<()>,
    commits: Arc<Notify>,
    stats: watch::Receiver<CheckpointStats>,
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Checkpointer {
    /// Checkpoints on `pool` once at start (what earlier processes left)
    /// and then after commits, [`COALESCE`] after the first of them, until
    /// everything committed is in the database file.
    pub(super) fn start(pool: SqlitePool) -> Self {
        let commits = Arc::new(Notify::new());
        let (report, stats) = watch::channel(CheckpointStats::default());
        let woken = commits.clone();
        let task = tokio::spawn(async move {
            loop {
                let copied_all = match checkpoint(&pool).await {
                    Ok((wal_pages, checkpointed_pages)) => {
                        report.send_modify(|s| {
                            s.runs += 1;
                            s.wal_pages = wal_pages;
                            s.checkpointed_pages = checkpointed_pages;
                        });
                        checkpointed_pages >= wal_pages
                    }
                    // The writer's backstop still bounds the WAL.
                    Err(e) => {
                        tracing::warn!("checkpointing the SQLite WAL failed: {e}");
                        false
                    }
                };
                // What a checkpoint could not copy (a reader held an older
                // snapshot) is copied by the next one, whether or not another
                // commit comes.
                if copied_all {
                    woken.notified().await;
                }
                tokio::time::sleep(COALESCE).await;
            }
        });
        Self {
            task,
            commits,
            stats,
        }
    }

    /// Tells the checkpointer that a transaction committed.
    pub(super) fn committed(&self) {
        self.commits.notify_one();
    }

    pub(super) fn stats(&self) -> watch::Receiver<CheckpointStats> {
        self.stats.clone()
    }
}

/// A passive checkpoint, which neither waits for nor blocks the writer (a
/// restarting one waited for it with SQLite's busy handler, and stalled a
/// chain of 5,000 stages for a second): the pages in the WAL and those
/// copied into the database file.
async fn checkpoint(pool: &SqlitePool) -> sqlx::Result<(i64, i64)> {
    let (_, wal, done): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
        .fetch_one(pool)
        .await?;
    Ok((wal, done))
}
