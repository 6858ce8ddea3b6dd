//! The raw limit `ratchet bench` compares against: one transaction with the
//! statement shape of a stage completion (canonical artifact insert, job
//! update, outbox row) and none of Ratchet's logic around it.

use super::*;

pub(super) async fn raw_completion(store: &SqliteStore, r: RawCompletion<'_>) -> Result<()> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    crate::store::canonical::put(&mut artifacts::Canonical(&mut tx), r.put).await?;
    sqlx::query("UPDATE jobs SET updated_at = ? WHERE id = ?")
        .bind(r.put.now)
        .bind(r.job_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (dedup_key) DO NOTHING",
    )
    .bind(format!("{}/{}/raw", r.put.run_id, r.put.artifact.name))
    .bind(r.put.run_id)
    .bind(r.put.stage)
    .bind("bench.raw")
    .bind("{}")
    .bind(r.put.now)
    .execute(&mut *tx)
    .await?;
    store.commit(tx).await?;
    Ok(())
}
