//! `artifacts` and `model_calls`: both written canonical-first.

use sqlx::{PgPool, Row};

use super::*;
use crate::llm::FinishReason;
use crate::store::canonical::{self, CanonicalTx, ModelCallTx};

/// One artifact, canonical-first, in a transaction of its own.
pub(super) async fn put_canonical(
    store: &PostgresStore,
    a: ArtifactPut<'_>,
) -> Result<CanonicalArtifact> {
    let mut tx = store.begin_write().await?;
    let canonical = canonical::put(&mut Canonical(&mut tx), a).await?;
    tx.commit().await?;
    Ok(canonical)
}

/// The statements of `store::canonical` on a write transaction: `INSERT …
/// ON CONFLICT DO NOTHING RETURNING`, then the winner.
pub(super) struct Canonical<'t>(pub &'t mut sqlx::PgConnection);

impl CanonicalTx for Canonical<'_> {
    async fn artifact_insert(&mut self, a: &ArtifactPut<'_>) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "INSERT INTO artifacts (run_id, stage, output, media_type, bytes, digest, size,
                                    attempt, plugin_digest, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (run_id, stage, output) DO NOTHING
             RETURNING digest",
        )
        .bind(a.run_id)
        .bind(a.stage)
        .bind(&a.artifact.name)
        .bind(&a.artifact.media_type)
        .bind(&a.artifact.bytes)
        .bind(&a.artifact.digest)
        .bind(a.artifact.bytes.len() as i64)
        .bind(a.attempt)
        .bind(a.plugin_digest)
        .bind(a.now)
        .fetch_optional(&mut *self.0)
        .await?)
    }

    async fn artifact_digest(&mut self, a: &ArtifactPut<'_>) -> Result<String> {
        Ok(sqlx::query_scalar(
            "SELECT digest FROM artifacts WHERE run_id = $1 AND stage = $2 AND output = $3",
        )
        .bind(a.run_id)
        .bind(a.stage)
        .bind(&a.artifact.name)
        .fetch_one(&mut *self.0)
        .await?)
    }
}

pub(super) async fn get(
    pool: &PgPool,
    run_id: &str,
    stage: &str,
    output: &str,
) -> Result<Option<Artifact>> {
    let row =
        sqlx::query("SELECT * FROM artifacts WHERE run_id = $1 AND stage = $2 AND output = $3")
            .bind(run_id)
            .bind(stage)
            .bind(output)
            .fetch_optional(pool)
            .await?;
    row.map(|row| {
        Ok(Artifact {
            meta: rows::artifact_meta(&row)?,
            bytes: row.try_get("bytes")?,
        })
    })
    .transpose()
}

pub(super) async fn list<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    run_id: Option<&str>,
) -> Result<Vec<ArtifactMeta>> {
    let rows = sqlx::query(
        "SELECT run_id, stage, output, media_type, digest, size, attempt, plugin_digest, created_at
         FROM artifacts WHERE ($1::TEXT IS NULL OR run_id = $1)
         ORDER BY run_id, created_at, stage, output",
    )
    .bind(run_id)
    .fetch_all(ex)
    .await?;
    rows.iter().map(rows::artifact_meta).collect()
}

/// One query: every binding of the stage with the artifact it names.
pub(super) async fn inputs_load(
    store: &PostgresStore,
    run_id: &str,
    stage: &str,
) -> Result<Vec<LoadedInput>> {
    let rows = sqlx::query(
        "SELECT * FROM ratchet_inputs_of(ARRAY[NULL::BIGINT], ARRAY[$1::TEXT], ARRAY[$2::TEXT])",
    )
    .bind(run_id)
    .bind(stage)
    .fetch_all(&store.pool)
    .await?;
    rows.iter().map(rows::loaded_input).collect()
}

pub(super) async fn model_call_put(store: &PostgresStore, m: ModelCallPut) -> Result<ModelCall> {
    let mut tx = store.begin_write().await?;
    let call = canonical::put_model_call(&mut Canonical(&mut tx), &m).await?;
    tx.commit().await?;
    Ok(call)
}

impl ModelCallTx for Canonical<'_> {
    async fn model_call_insert(&mut self, m: &ModelCallPut) -> Result<()> {
        sqlx::query(
            "INSERT INTO model_calls (run_id, stage, call_index, request_digest, response, rejected,
                                         attempt, created_at, prompt_tokens, completion_tokens,
                                         finish_reason, model, kind, http_status, http_headers)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
             ON CONFLICT (run_id, stage, call_index) DO NOTHING",
        )
        .bind(&m.run_id)
        .bind(&m.stage)
        .bind(m.index)
        .bind(&m.request_digest)
        .bind(m.stored_response())
        .bind(i64::from(m.rejected))
        .bind(m.attempt)
        .bind(m.now)
        .bind(m.usage.map(|u| i64::from(u.prompt_tokens)))
        .bind(m.usage.map(|u| i64::from(u.completion_tokens)))
        .bind(m.finish_reason.map(FinishReason::as_str))
        .bind(&m.model)
        .bind(m.kind.as_str())
        .bind(m.http.as_ref().map(|h| i64::from(h.status)))
        .bind(m.http_headers_json())
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn model_call_read(&mut self, m: &ModelCallPut) -> Result<ModelCall> {
        let row = sqlx::query(
            "SELECT * FROM model_calls WHERE run_id = $1 AND stage = $2 AND call_index = $3",
        )
        .bind(&m.run_id)
        .bind(&m.stage)
        .bind(m.index)
        .fetch_one(&mut *self.0)
        .await?;
        rows::model_call(&row)
    }
}

pub(super) async fn model_call_get(
    pool: &PgPool,
    run_id: &str,
    stage: &str,
    index: i64,
) -> Result<Option<ModelCall>> {
    let row = sqlx::query(
        "SELECT * FROM model_calls WHERE run_id = $1 AND stage = $2 AND call_index = $3",
    )
    .bind(run_id)
    .bind(stage)
    .bind(index)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(rows::model_call).transpose()
}

pub(super) async fn model_call_list(pool: &PgPool, run_id: &str) -> Result<Vec<ModelCall>> {
    let rows =
        sqlx::query("SELECT * FROM model_calls WHERE run_id = $1 ORDER BY stage, call_index")
            .bind(run_id)
            .fetch_all(pool)
            .await?;
    rows.iter().map(rows::model_call).collect()
}
