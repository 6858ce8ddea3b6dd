//! `deliveries`: the relay's routing, claims and results (`store::deliveries`).

use sqlx::SqlitePool;

use super::*;
use crate::store::deliveries::{self, Finished, RouteTx};

/// The event columns of a claimed delivery, then the delivery's.
const CLAIMED_COLUMNS: &str = "o.id, o.dedup_key, o.run_id, o.stage, o.event, o.payload,
     o.created_at, o.routed_at, d.id AS delivery_id, d.sink, d.attempts, d.retrying_since";

pub(super) async fn unrouted(pool: &SqlitePool, limit: usize) -> Result<Vec<OutboxRow>> {
    let rows = sqlx::query("SELECT * FROM outbox WHERE routed_at IS NULL ORDER BY id LIMIT ?")
        .bind(limit as i64)
        .fetch_all(pool)
        .await?;
    rows.iter().map(rows::outbox_row).collect()
}

pub(super) async fn route(store: &SqliteStore, r: &Routing) -> Result<()> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    deliveries::route(&mut RoutingTx(&mut tx), r).await?;
    store.commit(tx).await
}

/// The statements of `store::deliveries` on the writer's transaction.
struct RoutingTx<'t, 'c>(&'t mut Tx<'c>);

impl RouteTx for RoutingTx<'_, '_> {
    async fn deliveries_insert(&mut self, d: &[NewDelivery], now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO deliveries (outbox_id, sink, run_id, state, next_at, retrying_since,
                                     created_at)
             SELECT value ->> 'outbox_id', value ->> 'sink', value ->> 'run_id', 'pending',
                    ?2, ?2, ?2
             FROM jsonb_each(?1)
             WHERE true -- an upsert's SELECT needs a WHERE, or ON parses as a join's
             ON CONFLICT (outbox_id, sink) DO NOTHING",
        )
        .bind(to_json(&d))
        .bind(now)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn outbox_mark_routed(&mut self, events: &[i64], now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE outbox SET routed_at = ?2
             WHERE id IN (SELECT value FROM jsonb_each(?1)) AND routed_at IS NULL",
        )
        .bind(to_json(&events))
        .bind(now)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }
}

pub(super) async fn finish_then_claim(
    store: &SqliteStore,
    finished: &[DeliveryFinish],
    claim: Option<&DeliveryClaim>,
) -> Result<(Vec<bool>, Vec<ClaimedDelivery>)> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let mut recorded = Vec::with_capacity(finished.len());
    for f in finished {
        recorded.push(finish(&mut tx, f).await?);
    }
    let claimed = match claim {
        Some(c) => self::claim(&mut tx, c).await?,
        None => Vec::new(),
    };
    store.commit(tx).await?;
    Ok((recorded, claimed))
}

async fn finish(tx: &mut Tx<'_>, f: &DeliveryFinish) -> Result<bool> {
    let w = Finished::of(f);
    let rows = sqlx::query(
        "UPDATE deliveries SET state = ?, next_at = COALESCE(?, next_at), last_status = ?,
                last_error = ?, delivered_at = ?, lease_owner = NULL, lease_expires_at = NULL
         WHERE id = ? AND lease_owner = ? AND attempts = ? AND state = 'pending'",
    )
    .bind(w.state.as_str())
    .bind(w.next_at)
    .bind(w.status)
    .bind(w.error)
    .bind(w.delivered_at)
    .bind(f.id)
    .bind(&f.relay)
    .bind(f.attempts)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(rows == 1)
}

async fn claim(tx: &mut Tx<'_>, c: &DeliveryClaim) -> Result<Vec<ClaimedDelivery>> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "UPDATE deliveries SET lease_owner = ?1, lease_expires_at = ?2 + ?3,
                attempts = attempts + 1
         WHERE id IN (
             SELECT d.id FROM deliveries d
             WHERE d.state = 'pending' AND d.next_at <= ?2
               AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= ?2)
               AND d.sink IN (SELECT value FROM jsonb_each(?4))
               AND NOT EXISTS (
                   SELECT 1 FROM deliveries e
                   WHERE e.state = 'pending' AND e.run_id = d.run_id AND e.sink = d.sink
                     AND e.outbox_id < d.outbox_id)
             ORDER BY d.next_at, d.outbox_id
             LIMIT ?5)
         RETURNING id",
    )
    .bind(&c.relay)
    .bind(c.now)
    .bind(c.lease_ms)
    .bind(to_json(&c.sinks))
    .bind(c.limit as i64)
    .fetch_all(&mut **tx)
    .await?;
    let sql = format!(
        "SELECT {CLAIMED_COLUMNS} FROM deliveries d JOIN outbox o ON o.id = d.outbox_id
         WHERE d.id IN (SELECT value FROM jsonb_each(?)) ORDER BY o.id, d.sink"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(to_json(&ids))
        .fetch_all(&mut **tx)
        .await?;
    rows.iter().map(rows::claimed_delivery).collect()
}

pub(super) async fn list(pool: &SqlitePool, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
    let rows = sqlx::query(
        "SELECT d.*, o.dedup_key, o.event FROM deliveries d JOIN outbox o ON o.id = d.outbox_id
         WHERE (?1 IS NULL OR d.run_id = ?1) AND (?2 IS NULL OR d.state = ?2)
         ORDER BY d.outbox_id, d.sink",
    )
    .bind(f.run_id.as_deref())
    .bind(f.state.map(DeliveryState::as_str))
    .fetch_all(pool)
    .await?;
    rows.iter().map(rows::delivery_row).collect()
}

pub(super) async fn pending_by_sink(pool: &SqlitePool) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT sink, COUNT(*) FROM deliveries WHERE state = 'pending' GROUP BY sink ORDER BY sink",
    )
    .fetch_all(pool)
    .await?)
}

pub(super) async fn redeliver(store: &SqliteStore, r: Redeliver, now: i64) -> Result<u64> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let n = sqlx::query(
        "UPDATE deliveries SET state = 'pending', attempts = 0, next_at = ?1,
                retrying_since = ?1, lease_owner = NULL, lease_expires_at = NULL
         WHERE state = 'dead' AND (?2 IS NULL OR id = ?2)",
    )
    .bind(now)
    .bind(r.only())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    store.commit(tx).await?;
    Ok(n)
}
