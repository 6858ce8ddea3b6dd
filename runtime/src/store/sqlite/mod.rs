//! SQLite backend: WAL, `synchronous=FULL`, one writer at a time
//! (`BEGIN IMMEDIATE`), many readers.

mod artifacts;
mod audit;
mod jobs;
mod plugins;
mod runs;

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
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
    /// migrates it. `?synchronous=normal` trades durability of the last
    /// commits on power loss for speed; the default is `full`.
    pub async fn open(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|_| StoreError::UnsupportedUrl(url.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let options = if url.contains("synchronous=") {
            options
        } else {
            options.synchronous(SqliteSynchronous::Full)
        };
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

#[async_trait]
impl Store for SqliteStore {
    async fn plugin_put(&self, p: PluginPut) -> Result<PluginPutOutcome> {
        plugins::put(self, p).await
    }
    async fn plugin_get(&self, digest: &str) -> Result<Option<PluginRecord>> {
        plugins::get(self, digest).await
    }
    async fn plugin_list(&self) -> Result<Vec<PluginSummary>> {
        plugins::list(self).await
    }
    async fn plugin_yank(&self, name: &str, version: &str) -> Result<bool> {
        plugins::yank(self, name, version).await
    }
    async fn plugin_usage(&self, digest: &str) -> Result<i64> {
        plugins::usage(self, digest).await
    }
    async fn run_events(&self, run_id: &str) -> Result<Vec<RunEvent>> {
        runs::events(self, run_id).await
    }
    async fn job_repin(&self, r: JobRepin) -> Result<RepinOutcome> {
        runs::repin(self, r).await
    }
    async fn run_submit(&self, r: RunSubmit) -> Result<RunSubmitOutcome> {
        runs::submit(self, r).await
    }
    async fn run_get(&self, run_id: &str) -> Result<Option<RunRow>> {
        runs::get(self, run_id).await
    }
    async fn run_list(&self) -> Result<Vec<RunRow>> {
        runs::list(self).await
    }
    async fn job_claim(&self, c: JobClaim) -> Result<Option<ClaimedJob>> {
        jobs::claim(self, c).await
    }
    async fn job_complete(&self, c: JobComplete) -> Result<CompleteOutcome> {
        jobs::complete(self, c).await
    }
    async fn job_fail(&self, f: JobFail) -> Result<FailOutcome> {
        jobs::fail(self, f).await
    }
    async fn job_list(&self, run_id: &str) -> Result<Vec<JobRow>> {
        jobs::list(&self.pool, Some(run_id)).await
    }
    async fn job_summary(&self, now: i64) -> Result<JobSummary> {
        jobs::summary(self, now).await
    }
    async fn job_inputs_load(&self, run_id: &str, stage: &str) -> Result<Vec<LoadedInput>> {
        artifacts::inputs_load(self, run_id, stage).await
    }
    async fn artifact_put_canonical(&self, a: ArtifactPut) -> Result<CanonicalArtifact> {
        let mut tx = self.begin_write().await?;
        let canonical = artifacts::put_canonical_tx(&mut tx, &a).await?;
        tx.commit().await?;
        Ok(canonical)
    }
    async fn artifact_get(
        &self,
        run_id: &str,
        stage: &str,
        output: &str,
    ) -> Result<Option<Artifact>> {
        artifacts::get(&self.pool, run_id, stage, output).await
    }
    async fn artifact_list(&self, run_id: &str) -> Result<Vec<ArtifactMeta>> {
        artifacts::list(&self.pool, Some(run_id)).await
    }
    async fn model_call_put(&self, m: ModelCallPut) -> Result<ModelCall> {
        artifacts::model_call_put(self, m).await
    }
    async fn model_call_get(
        &self,
        run_id: &str,
        stage: &str,
        index: i64,
    ) -> Result<Option<ModelCall>> {
        artifacts::model_call_get(&self.pool, run_id, stage, index).await
    }
    async fn model_call_list(&self, run_id: &str) -> Result<Vec<ModelCall>> {
        artifacts::model_call_list(&self.pool, run_id).await
    }
    async fn attempt_list(&self, run_id: &str) -> Result<Vec<AttemptRow>> {
        audit::attempts(&self.pool, Some(run_id)).await
    }
    async fn outbox_list(&self, run_id: Option<&str>) -> Result<Vec<OutboxRow>> {
        audit::outbox(&self.pool, run_id).await
    }
    async fn reconcile(&self, now: i64) -> Result<ReconcileReport> {
        jobs::reconcile(self, now).await
    }
    async fn audit_facts(&self) -> Result<AuditFacts> {
        audit::facts(self).await
    }
}
