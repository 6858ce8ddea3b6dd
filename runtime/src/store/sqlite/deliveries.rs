//! `deliveries`: the relay's routing, claims and results (`store::deliveries`).

use std::collections::HashSet;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use sqlx::SqlitePool;

use super::*;
use crate::store::deliveries::Finished;

pub(super) async fn unrouted(pool: &SqlitePool, limit: usize) -> Result<Vec<UnroutedEvent>> {
    let page: String = sqlx::query_scalar(
        "SELECT json_group_array(json_array(id, run_id, event) ORDER BY id)
         FROM (SELECT id, run_id, event FROM outbox WHERE routed_at IS NULL ORDER BY id LIMIT ?)",
    )
    .bind(limit as i64)
    .fetch_one(pool)
    .await?;
    let rows: Vec<(i64, String, String)> = from_json("outbox", &page)?;
    Ok(rows.into_iter().map(UnroutedEvent::from).collect())
}

/// A statement that reads many rows returns them as one JSON array (ADR
/// 0037): sqlx hands each row over from the connection's thread on its
/// own, with a copy of each of its values, and that cost more than the
/// statement.
fn from_json<T: DeserializeOwned>(table: &'static str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| rows::corrupt(table, e))
}

/// Events a relay routes per transaction: routing holds the one writer for
/// the whole page, and the books wait for it.
pub(super) const ROUTE_PAGE: usize = 512;

/// Routes the next page: its events read, the deliveries, skipping any
/// `(event, sink)` already there (another relay routed the same page),
/// then the events' mark, in one transaction; returns how many events it
/// read. With none to route it takes no writer.
pub(super) async fn route(store: &SqliteStore, r: &Routing) -> Result<usize> {
    let events = unrouted(&store.pool, r.page).await?;
    if events.is_empty() {
        return Ok(0);
    }
    let deliveries = r.deliveries_of(&events);
    let mut writer = store.writer.lock().await;
    let mut tx = begin(&mut writer, Durability::Lazy).await?;
    if !deliveries.is_empty() {
        sqlx::query(
            "INSERT INTO deliveries (outbox_id, sink, run_id, state, next_at, retrying_since,
                                     created_at)
             SELECT value ->> 'outbox_id', value ->> 'sink', value ->> 'run_id', 'pending',
                    ?2, ?2, ?2
             FROM jsonb_each(?1)
             WHERE true -- an upsert's SELECT needs a WHERE, or ON parses as a join's
             ON CONFLICT (outbox_id, sink) DO NOTHING",
        )
        .bind(to_json(&deliveries))
        .bind(r.now)
        .execute(&mut *tx)
        .await?;
    }
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    sqlx::query(
        "UPDATE outbox SET routed_at = ?2
         WHERE id IN (SELECT value FROM jsonb_each(?1)) AND routed_at IS NULL",
    )
    .bind(to_json(&ids))
    .bind(r.now)
    .execute(&mut *tx)
    .await?;
    store.commit(tx).await?;
    Ok(events.len())
}

pub(super) async fn finish_then_claim(
    store: &SqliteStore,
    finished: &[DeliveryFinish],
    claim: Option<&DeliveryClaim>,
) -> Result<(Vec<bool>, Vec<ClaimedDelivery>)> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin(&mut writer, Durability::Lazy).await?;
    let recorded = if finished.is_empty() {
        Vec::new()
    } else {
        finish(&mut tx, finished).await?
    };
    let claimed = match claim {
        Some(c) => self::claim(&mut tx, c).await?,
        None => Vec::new(),
    };
    store.commit(tx).await?;
    Ok((recorded, claimed))
}

/// Records the results sent under leases the relay still holds: the
/// pending ones whose lease's holder still has it, found first, then
/// written in one statement whose rows are JSON arrays (their columns by
/// position).
async fn finish(tx: &mut Tx<'_>, finished: &[DeliveryFinish]) -> Result<Vec<bool>> {
    let leased: Vec<(i64, i64, i64, &str)> = finished
        .iter()
        .map(|f| (f.id, f.lease.holder, f.lease.attempts, f.relay.as_str()))
        .collect();
    let recordable: String = sqlx::query_scalar(
        "SELECT json_group_array(d.id) FROM jsonb_each(?) AS l
         JOIN deliveries d ON d.id = l.value ->> 0 AND d.state = 'pending'
         JOIN deliveries h ON h.id = l.value ->> 1 AND h.attempts = l.value ->> 2
                          AND h.lease_owner = l.value ->> 3 AND h.state = 'pending'",
    )
    .bind(to_json(&leased))
    .fetch_one(&mut **tx)
    .await?;
    let recordable: HashSet<i64> = from_json("deliveries", &recordable)?;
    let rows: Vec<_> = finished
        .iter()
        .filter(|f| recordable.contains(&f.id))
        .map(|f| {
            let w = Finished::of(f);
            (
                f.id,
                w.state.as_str(),
                w.next_at,
                w.status,
                w.error,
                w.delivered_at,
                w.attempts,
                w.unsent,
            )
        })
        .collect();
    sqlx::query(
        "UPDATE deliveries AS d SET state = x.state, next_at = COALESCE(x.next_at, d.next_at),
                last_status = CASE WHEN x.unsent THEN d.last_status ELSE x.status END,
                last_error = CASE WHEN x.unsent THEN d.last_error ELSE x.error END,
                delivered_at = x.delivered_at, attempts = x.attempts,
                lease_owner = NULL, lease_expires_at = NULL
         FROM (SELECT value ->> 0 AS id, value ->> 1 AS state, value ->> 2 AS next_at,
                      value ->> 3 AS status, value ->> 4 AS error, value ->> 5 AS delivered_at,
                      value ->> 6 AS attempts, value ->> 7 AS unsent
               FROM jsonb_each(?)) AS x
         WHERE d.id = x.id",
    )
    .bind(to_json(&rows))
    .execute(&mut **tx)
    .await?;
    Ok(finished
        .iter()
        .map(|f| recordable.contains(&f.id))
        .collect())
}

async fn claim(tx: &mut Tx<'_>, c: &DeliveryClaim) -> Result<Vec<ClaimedDelivery>> {
    // A run's span ends at its `per_run`-th pending delivery (the bound
    // keeps the window below from reading a long backlog whole), and before
    // the first one leased or waiting for a retry. Only its head, the run's
    // earliest pending delivery, records the lease (`DeliveryLease`). A
    // span carries the columns it returns: no second lookup of each row.
    let claimed: String = sqlx::query_scalar(
        "WITH heads AS (
             SELECT d.id, d.run_id, d.sink, d.outbox_id, d.attempts FROM deliveries d
             WHERE d.state = 'pending' AND d.next_at <= ?1
               AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= ?1)
               AND d.sink IN (SELECT value FROM jsonb_each(?2))
               AND NOT EXISTS (
                   SELECT 1 FROM deliveries e
                   WHERE e.state = 'pending' AND e.run_id = d.run_id AND e.sink = d.sink
                     AND e.outbox_id < d.outbox_id)
             ORDER BY d.next_at, d.outbox_id
             LIMIT ?3),
         spans AS (
             SELECT e.id, e.sink, e.outbox_id, e.attempts, e.retrying_since,
                    h.id AS lease_holder, h.attempts + 1 AS lease_attempts,
                    count(*) FILTER (WHERE e.next_at > ?1 OR e.lease_expires_at > ?1)
                        OVER (PARTITION BY e.run_id, e.sink ORDER BY e.outbox_id) AS held
             FROM heads h JOIN deliveries e
               ON e.state = 'pending' AND e.run_id = h.run_id AND e.sink = h.sink
              AND e.outbox_id >= h.outbox_id
              AND e.outbox_id <= COALESCE(
                  (SELECT x.outbox_id FROM deliveries x
                   WHERE x.state = 'pending' AND x.run_id = h.run_id AND x.sink = h.sink
                     AND x.outbox_id >= h.outbox_id
                   ORDER BY x.outbox_id LIMIT 1 OFFSET ?4 - 1),
                  9223372036854775807))
         SELECT json_group_array(json_array(
                    s.id, s.sink, s.attempts + 1, s.retrying_since, s.lease_holder,
                    s.lease_attempts, o.id, o.dedup_key, o.run_id, o.stage, o.event, o.payload,
                    o.created_at)
                ORDER BY o.id, s.sink)
         FROM spans s JOIN outbox o ON o.id = s.outbox_id
         WHERE s.held = 0",
    )
    .bind(c.now)
    .bind(to_json(&c.sinks))
    .bind(c.runs as i64)
    .bind(c.per_run as i64)
    .fetch_one(&mut **tx)
    .await?;
    let claimed: Vec<ClaimedDelivery> = from_json::<Vec<Claimed>>("deliveries", &claimed)?
        .into_iter()
        .map(ClaimedDelivery::from)
        .collect();
    let holders: Vec<i64> = claimed
        .iter()
        .filter(|d| d.lease.holder == d.id)
        .map(|d| d.id)
        .collect();
    sqlx::query(
        "UPDATE deliveries SET lease_owner = ?1, lease_expires_at = ?2 + ?3,
                attempts = attempts + 1
         WHERE id IN (SELECT value FROM jsonb_each(?4))",
    )
    .bind(&c.relay)
    .bind(c.now)
    .bind(c.lease_ms)
    .bind(to_json(&holders))
    .execute(&mut **tx)
    .await?;
    Ok(claimed)
}

/// A claimed delivery as the claim returns it: a JSON array of these
/// columns, in this order.
#[derive(Deserialize)]
struct Claimed {
    id: i64,
    sink: String,
    attempts: i64,
    retrying_since: i64,
    lease_holder: i64,
    lease_attempts: i64,
    outbox_id: i64,
    dedup_key: String,
    run_id: String,
    stage: String,
    event: String,
    payload: String,
    created_at: i64,
}

impl From<Claimed> for ClaimedDelivery {
    fn from(c: Claimed) -> Self {
        Self {
            id: c.id,
            sink: c.sink,
            attempts: c.attempts,
            retrying_since: c.retrying_since,
            lease: DeliveryLease {
                holder: c.lease_holder,
                attempts: c.lease_attempts,
            },
            event: OutboxRow {
                id: c.outbox_id,
                dedup_key: c.dedup_key,
                run_id: c.run_id,
                stage: c.stage,
                event: c.event,
                payload: c.payload,
                created_at: c.created_at,
            },
        }
    }
}

/// A run's deliveries are found through its events (`outbox_run_stage`),
/// which the foreign key keeps there: `deliveries` has no index by run
/// (migration 0024).
pub(super) async fn list(pool: &SqlitePool, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
    // Two statements, not one with `run IS NULL OR`: SQLite plans that as
    // a walk over every delivery, and the audit lists each run's.
    let state = f.state.map(DeliveryState::as_str);
    let rows = match &f.run_id {
        Some(run) => sqlx::query(
            "SELECT d.*, o.dedup_key, o.event, o.stage
             FROM outbox o JOIN deliveries d ON d.outbox_id = o.id
             WHERE o.run_id = ?1 AND (?2 IS NULL OR d.state = ?2)
             ORDER BY d.outbox_id, d.sink",
        )
        .bind(run)
        .bind(state),
        None => sqlx::query(
            "SELECT d.*, o.dedup_key, o.event, o.stage
             FROM deliveries d JOIN outbox o ON o.id = d.outbox_id
             WHERE ?1 IS NULL OR d.state = ?1
             ORDER BY d.outbox_id, d.sink",
        )
        .bind(state),
    }
    .fetch_all(pool)
    .await?;
    rows.iter().map(rows::delivery_row).collect()
}

/// Always empty: SQLite finds its dead letters through an index of them,
/// not a table of their own.
pub(super) async fn dead_misfiled(
    _: &SqlitePool,
    _: Option<&str>,
) -> Result<Vec<MisfiledDeadLetter>> {
    Ok(Vec::new())
}

/// Always empty unless a hand on the database turned the foreign key off.
pub(super) async fn orphaned(pool: &SqlitePool, run: Option<&str>) -> Result<Vec<OrphanDelivery>> {
    let rows: Vec<(i64, i64, String, String)> = sqlx::query_as(
        "SELECT d.id, d.outbox_id, d.sink, d.run_id FROM deliveries d
         WHERE (?1 IS NULL OR d.run_id = ?1)
           AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = d.outbox_id)
         ORDER BY d.id",
    )
    .bind(run)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(OrphanDelivery::from).collect())
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

/// Nothing to do: a claim finds the runs it may send from the pending
/// deliveries themselves, so every pending delivery is claimable.
pub(super) async fn reconcile(_pool: &SqlitePool) -> Result<u64> {
    Ok(0)
}
