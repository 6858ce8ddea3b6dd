//! `artifacts` and `model_calls`: both written canonical-first.

use sqlx::{Row, SqlitePool};

use super::*;
use crate::llm::FinishReason;
use crate::store::canonical::{self, CanonicalTx, ModelCallTx};

pub(super) const META_COLUMNS: &str =
    "run_id, stage, output, media_type, digest, size, attempt, plugin_digest, created_at";

/// One artifact, canonical-first, in a transaction of its own.
pub(super) async fn put_canonical(
    store: &SqliteStore,
    a: ArtifactPut<'_>,
) -> Result<CanonicalArtifact> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let canonical = canonical::put(&mut Canonical(&mut tx), a).await?;
    store.commit(tx).await?;
    Ok(canonical)
}

/// The statements of `store::canonical` on a write transaction: `INSERT …
/// ON CONFLICT DO NOTHING RETURNING`, then the winner.
pub(super) struct Canonical<'t>(pub &'t mut SqliteConnection);

impl CanonicalTx for Canonical<'_> {
    async fn artifact_insert(&mut self, a: &ArtifactPut<'_>) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "INSERT INTO artifacts (run_id, stage, output, media_type, bytes, digest, size,
                                    attempt, plugin_digest, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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
            "SELECT digest FROM artifacts WHERE run_id = ? AND stage = ? AND output = ?",
        )
        .bind(a.run_id)
        .bind(a.stage)
        .bind(&a.artifact.name)
        .fetch_one(&mut *self.0)
        .await?)
    }
}

pub(super) async fn get(
    pool: &SqlitePool,
    run_id: &str,
    stage: &str,
    output: &str,
) -> Result<Option<Artifact>> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {META_COLUMNS}, bytes FROM artifacts WHERE run_id = ? AND stage = ? AND output = ?"
    )))
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
    ex: impl sqlx::Executor<'e, Database = Sqlite>,
    run_id: Option<&str>,
) -> Result<Vec<ArtifactMeta>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {META_COLUMNS} FROM artifacts WHERE (?1 IS NULL OR run_id = ?1)
         ORDER BY run_id, created_at, stage, output"
    )))
    .bind(run_id)
    .fetch_all(ex)
    .await?;
    rows.iter().map(rows::artifact_meta).collect()
}

/// A stage's input bindings (`b`, from `job_inputs`), each with the
/// artifact it names (`a`), or none if it is missing.
pub(super) const INPUT_COLUMNS: &str = "b.input, b.from_stage, b.from_output,
        a.run_id, a.stage, a.output, a.media_type, a.digest, a.size, a.attempt,
        a.plugin_digest, a.created_at, a.bytes";
pub(super) const ARTIFACT_OF_INPUT: &str = "LEFT JOIN artifacts a
   ON a.run_id = b.run_id AND a.stage = b.from_stage AND a.output = b.from_output";

/// One query: every binding of the stage with the artifact it names.
pub(super) async fn inputs_load(
    store: &SqliteStore,
    run_id: &str,
    stage: &str,
) -> Result<Vec<LoadedInput>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {INPUT_COLUMNS} FROM job_inputs b {ARTIFACT_OF_INPUT}
         WHERE b.run_id = ? AND b.stage = ? ORDER BY b.input"
    )))
    .bind(run_id)
    .bind(stage)
    .fetch_all(&store.pool)
    .await?;
    rows.iter().map(rows::loaded_input).collect()
}

pub(super) async fn model_call_put(store: &SqliteStore, m: ModelCallPut) -> Result<ModelCall> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let call = canonical::put_model_call(&mut Canonical(&mut tx), &m).await?;
    store.commit(tx).await?;
    Ok(call)
}

impl ModelCallTx for Canonical<'_> {
    async fn model_call_insert(&mut self, m: &ModelCallPut) -> Result<()> {
        sqlx::query(
            "INSERT INTO model_calls (run_id, stage, call_index, request_digest, response, rejected,
                                         attempt, created_at, prompt_tokens, completion_tokens,
                                         finish_reason, model, kind, http_status, http_headers)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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
            "SELECT * FROM model_calls WHERE run_id = ? AND stage = ? AND call_index = ?",
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
    pool: &SqlitePool,
    run_id: &str,
    stage: &str,
    index: i64,
) -> Result<Option<ModelCall>> {
    let row =
        sqlx::query("SELECT * FROM model_calls WHERE run_id = ? AND stage = ? AND call_index = ?")
            .bind(run_id)
            .bind(stage)
            .bind(index)
            .fetch_optional(pool)
            .await?;
    row.as_ref().map(rows::model_call).transpose()
}

pub(super) async fn model_call_list(pool: &SqlitePool, run_id: &str) -> Result<Vec<ModelCall>> {
    let rows = sqlx::query("SELECT * FROM model_calls WHERE run_id = ? ORDER BY stage, call_index")
        .bind(run_id)
        .fetch_all(pool)
        .await?;
    rows.iter().map(rows::model_call).collect()
}
