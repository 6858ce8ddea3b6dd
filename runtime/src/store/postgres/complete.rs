//! The statements of a completion (`store::complete`), in PostgreSQL's dialect.

use sqlx::Row;

use super::*;
use crate::store::complete::{self, AttemptSucceeded, CompletionTx, Fenced, OutboxPut};

pub(super) async fn batch(store: &PostgresStore, b: &JobBatch) -> Result<JobBatchOutcome> {
    let mut tx = store.begin_write().await?;
    let completed = complete::complete_many(&mut Completion(&mut tx), &b.completions).await?;
    let claimed = match &b.claim {
        Some(claim) => jobs::claim_tx(&mut tx, claim).await?,
        None => Vec::new(),
    };
    tx.commit().await?;
    Ok(JobBatchOutcome { completed, claimed })
}

struct Completion<'t>(&'t mut Tx);

impl CompletionTx for Completion<'_> {
    async fn fence(&mut self, job_id: i64, attempt: i64, worker: &str) -> Result<Option<Fenced>> {
        let Some(row) = jobs::fence(self.0, job_id, attempt, worker).await? else {
            return Ok(None);
        };
        Ok(Some(Fenced {
            run_id: row.try_get("run_id")?,
            stage: row.try_get("stage")?,
            plugin_digest: row.try_get("plugin_digest")?,
            emits: rows::json_list("jobs", &row.try_get::<String, _>("emits")?)?,
        }))
    }

    async fn artifact_put_canonical(&mut self, a: CanonicalPut<'_>) -> Result<CanonicalArtifact> {
        artifacts::put_canonical_tx(self.0, a).await
    }

    async fn outbox_put(&mut self, o: &OutboxPut<'_>) -> Result<()> {
        sqlx::query(
            "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (dedup_key) DO NOTHING",
        )
        .bind(&o.dedup_key)
        .bind(o.run_id)
        .bind(o.stage)
        .bind(o.event)
        .bind(&o.payload)
        .bind(o.now)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn job_succeed(&mut self, job_id: i64, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE jobs SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,
                    last_error = NULL, succeeded_seq = nextval('ratchet_seq'), updated_at = $1
             WHERE id = $2",
        )
        .bind(now)
        .bind(job_id)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn edges_satisfy(&mut self, run_id: &str, stage: &str) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "UPDATE edges SET satisfied = 1
             WHERE run_id = $1 AND from_stage = $2 AND satisfied = 0
             RETURNING to_stage",
        )
        .bind(run_id)
        .bind(stage)
        .fetch_all(&mut **self.0)
        .await?)
    }

    /// A decrement of the locked row reads its latest version, so two
    /// predecessors finishing at once cannot both miss each other (a recount
    /// in one statement could, under READ COMMITTED).
    async fn dependent_release(
        &mut self,
        run_id: &str,
        stage: &str,
        edges: i64,
        now: i64,
    ) -> Result<bool> {
        let state: Option<String> = sqlx::query_scalar(
            "UPDATE jobs SET pending = pending - $1,
                    state = CASE WHEN state = 'blocked' AND pending - $1 <= 0 THEN 'ready' ELSE state END,
                    next_run_at = CASE WHEN state = 'blocked' AND pending - $1 <= 0 THEN $2 ELSE next_run_at END,
                    updated_at = $2
             WHERE run_id = $3 AND stage = $4
             RETURNING state",
        )
        .bind(edges)
        .bind(now)
        .bind(run_id)
        .bind(stage)
        .fetch_optional(&mut **self.0)
        .await?;
        Ok(state.as_deref() == Some("ready"))
    }

    async fn attempt_succeed(&mut self, a: &AttemptSucceeded<'_>) -> Result<()> {
        sqlx::query(
            "UPDATE attempts SET outcome = 'succeeded', finished_at = $1, input_digests = $2,
                    proposal_digests = $3, canonical_digests = $4, proposal_won = $5
             WHERE job_id = $6 AND attempt = $7",
        )
        .bind(a.now)
        .bind(to_json(a.input_digests))
        .bind(to_json(&a.proposals))
        .bind(to_json(&a.canonical))
        .bind(i64::from(a.all_won))
        .bind(a.job_id)
        .bind(a.attempt)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    /// Locks the run row first: the last two completions of a run then see
    /// each other's commits, and one of them finishes the run.
    async fn run_finish_if_done(&mut self, run_id: &str, now: i64) -> Result<()> {
        sqlx::query("SELECT id FROM runs WHERE id = $1 FOR NO KEY UPDATE")
            .bind(run_id)
            .fetch_optional(&mut **self.0)
            .await?;
        sqlx::query(
            "UPDATE runs SET state = 'succeeded', finished_at = $1
             WHERE id = $2 AND state = 'running'
               AND NOT EXISTS (SELECT 1 FROM jobs WHERE run_id = $2
                                 AND state IN ('blocked', 'ready', 'running', 'failed', 'dead', 'cancelled'))",
        )
        .bind(now)
        .bind(run_id)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn ready_notify(&mut self) -> Result<()> {
        notify_ready(self.0).await
    }
}
