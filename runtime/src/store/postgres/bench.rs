//! The raw limit `ratchet bench` compares against: one transaction with the
//! statement shape of a stage completion (canonical artifact insert, job
//! update, outbox row) and none of Ratchet's logic around it.

use sqlx::PgPool;

use super::*;

pub(super) async fn raw_completion(store: &PostgresStore, r: RawCompletion<'_>) -> Result<()> {
    let mut tx = store.begin_write().await?;
    crate::store::canonical::put(&mut artifacts::Canonical(&mut tx), r.put).await?;
    sqlx::query("UPDATE jobs SET updated_at = $1 WHERE id = $2")
        .bind(r.put.now)
        .bind(r.job_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (dedup_key) DO NOTHING",
    )
    .bind(format!("{}/{}/raw", r.put.run_id, r.put.artifact.name))
    .bind(r.put.run_id)
    .bind(r.put.stage)
    .bind("bench.raw")
    .bind("{}")
    .bind(r.put.now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

impl PostgresStore {
    /// A new empty schema on the server at `base` for one bench scenario;
    /// returns the URL that selects it and the schema's name.
    pub async fn scratch_schema(base: &str, scenario: &str) -> Result<(String, String)> {
        let schema = format!("ratchet_bench_{scenario}_{}", uuid::Uuid::now_v7().simple());
        let pool = PgPool::connect(base).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&pool)
            .await?;
        pool.close().await;
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
        Ok((url, schema))
    }

    pub async fn drop_scratch_schema(base: &str, schema: &str) -> Result<()> {
        let pool = PgPool::connect(base).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&pool)
        .await?;
        pool.close().await;
        Ok(())
    }
}
