//! `deliveries`: the relay's routing, claims and results (`store::deliveries`).
//! Claims skip rows another relay is claiming (`SKIP LOCKED`), so any
//! number of relays share the work.

use sqlx::PgPool;

use super::*;
use crate::store::deliveries::{self, Finished, RouteTx};

pub(super) async fn unrouted(pool: &PgPool, limit: usize) -> Result<Vec<OutboxRow>> {
    let rows = sqlx::query("SELECT * FROM outbox WHERE routed_at IS NULL ORDER BY id LIMIT $1")
        .bind(limit as i64)
        .fetch_all(pool)
        .await?;
    rows.iter().map(rows::outbox_row).collect()
}

pub(super) async fn route(store: &PostgresStore, r: &Routing) -> Result<()> {
    let mut tx = store.begin_write().await?;
    deliveries::route(&mut RoutingTx(&mut tx), r).await?;
    tx.commit().await?;
    Ok(())
}

/// The statements of `store::deliveries` on a write transaction.
struct RoutingTx<'t>(&'t mut Tx);

impl RouteTx for RoutingTx<'_> {
    async fn deliveries_insert(&mut self, d: &[NewDelivery], now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO deliveries (outbox_id, sink, run_id, state, next_at, retrying_since,
                                     created_at)
             SELECT e, s, r, 'pending', $4, $4, $4
             FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::TEXT[]) AS u (e, s, r)
             ON CONFLICT (outbox_id, sink) DO NOTHING",
        )
        .bind(column(d, |d| d.outbox_id))
        .bind(column(d, |d| d.sink.as_str()))
        .bind(column(d, |d| d.run_id.as_str()))
        .bind(now)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }

    async fn outbox_mark_routed(&mut self, events: &[i64], now: i64) -> Result<()> {
        sqlx::query("UPDATE outbox SET routed_at = $2 WHERE id = ANY($1) AND routed_at IS NULL")
            .bind(events)
            .bind(now)
            .execute(&mut **self.0)
            .await?;
        Ok(())
    }
}

pub(super) async fn claim(
    store: &PostgresStore,
    c: &DeliveryClaim,
) -> Result<Vec<ClaimedDelivery>> {
    let rows = sqlx::query(
        "WITH picked AS (
             SELECT d.id FROM deliveries d
             WHERE d.state = 'pending' AND d.next_at <= $2
               AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= $2)
               AND d.sink = ANY($4)
               AND NOT EXISTS (
                   SELECT 1 FROM deliveries e
                   WHERE e.state = 'pending' AND e.run_id = d.run_id AND e.sink = d.sink
                     AND e.outbox_id < d.outbox_id)
             ORDER BY d.next_at, d.outbox_id
             LIMIT $5
             FOR UPDATE SKIP LOCKED)
         UPDATE deliveries d SET lease_owner = $1, lease_expires_at = $2 + $3,
                attempts = d.attempts + 1
         FROM picked, outbox o
         WHERE d.id = picked.id AND o.id = d.outbox_id
         RETURNING o.id, o.dedup_key, o.run_id, o.stage, o.event, o.payload, o.created_at,
                   o.routed_at, d.id AS delivery_id, d.sink, d.attempts, d.retrying_since",
    )
    .bind(&c.relay)
    .bind(c.now)
    .bind(c.lease_ms)
    .bind(&c.sinks)
    .bind(c.limit as i64)
    .fetch_all(&store.pool)
    .await?;
    let mut claimed = rows
        .iter()
        .map(rows::claimed_delivery)
        .collect::<Result<Vec<_>>>()?;
    claimed.sort_by(|a, b| (a.event.id, &a.sink).cmp(&(b.event.id, &b.sink)));
    Ok(claimed)
}

pub(super) async fn finish(store: &PostgresStore, f: &DeliveryFinish) -> Result<bool> {
    let w = Finished::of(f);
    let done = sqlx::query(
        "UPDATE deliveries SET state = $1, next_at = COALESCE($2, next_at), last_status = $3,
                last_error = $4, delivered_at = $5, lease_owner = NULL, lease_expires_at = NULL
         WHERE id = $6 AND lease_owner = $7 AND attempts = $8 AND state = 'pending'",
    )
    .bind(w.state.as_str())
    .bind(w.next_at)
    .bind(w.status)
    .bind(w.error)
    .bind(w.delivered_at)
    .bind(f.id)
    .bind(&f.relay)
    .bind(f.attempts)
    .execute(&store.pool)
    .await?
    .rows_affected();
    Ok(done == 1)
}

pub(super) async fn list(pool: &PgPool, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
    let rows = sqlx::query(
        "SELECT d.*, o.dedup_key, o.event FROM deliveries d JOIN outbox o ON o.id = d.outbox_id
         WHERE ($1::TEXT IS NULL OR d.run_id = $1) AND ($2::TEXT IS NULL OR d.state = $2)
         ORDER BY d.outbox_id, d.sink",
    )
    .bind(f.run_id.as_deref())
    .bind(f.state.map(DeliveryState::as_str))
    .fetch_all(pool)
    .await?;
    rows.iter().map(rows::delivery_row).collect()
}

pub(super) async fn pending_by_sink(pool: &PgPool) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT sink, COUNT(*) FROM deliveries WHERE state = 'pending' GROUP BY sink ORDER BY sink",
    )
    .fetch_all(pool)
    .await?)
}

pub(super) async fn redeliver(store: &PostgresStore, r: Redeliver, now: i64) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE deliveries SET state = 'pending', attempts = 0, next_at = $1,
                retrying_since = $1, lease_owner = NULL, lease_expires_at = NULL
         WHERE state = 'dead' AND ($2::BIGINT IS NULL OR id = $2)",
    )
    .bind(now)
    .bind(r.only())
    .execute(&store.pool)
    .await?
    .rows_affected())
}
