//! PostgreSQL backend: many worker processes on many hosts share one
//! database. Claims skip locked rows, fencing is the same as on SQLite, and
//! workers wake through `LISTEN/NOTIFY` on `ratchet_ready`.

mod artifacts;
mod audit;
mod jobs;
mod plugins;
mod runs;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::Notify;

use super::rows::{self, impl_row_ext, repin_refusal, to_json};
use super::*;

impl_row_ext!(sqlx::postgres::PgRow);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The channel a transaction notifies when it made a job ready.
const READY_CHANNEL: &str = "ratchet_ready";

type Tx = Transaction<'static, Postgres>;

#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to `postgres://…` and migrates the schema. The pool
    /// reconnects by itself after a connection or server restart.
    pub async fn open(url: &str) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|_| StoreError::UnsupportedUrl(url.to_string()))?;
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(Self { pool })
    }

    async fn begin(&self) -> Result<Tx> {
        Ok(self.pool.begin().await?)
    }
}

async fn next_seq(tx: &mut Tx) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT nextval('ratchet_seq')")
        .fetch_one(&mut **tx)
        .await?)
}

async fn notify_ready(tx: &mut Tx) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(READY_CHANNEL)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[async_trait]
impl Store for PostgresStore {
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
        let mut tx = self.begin().await?;
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

    fn listen_ready(&self, wake: Arc<Notify>) {
        let pool = self.pool.clone();
        tokio::spawn(async move {
            loop {
                let listened = async {
                    let mut listener = PgListener::connect_with(&pool).await?;
                    listener.listen(READY_CHANNEL).await?;
                    loop {
                        listener.recv().await?;
                        wake.notify_waiters();
                    }
                    #[allow(unreachable_code)]
                    Ok::<(), sqlx::Error>(())
                };
                if let Err(e) = listened.await {
                    tracing::warn!("LISTEN {READY_CHANNEL} failed, reconnecting: {e}");
                }
                // Wake everyone so that nothing waits on a lost notification.
                wake.notify_waiters();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
}
