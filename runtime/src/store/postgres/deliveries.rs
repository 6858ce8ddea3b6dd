//! `deliveries`: the relay's routing, claims and results (`store::deliveries`).
//! Claims skip rows another relay is claiming (`SKIP LOCKED`), so any
//! number of relays share the work.

use std::collections::HashSet;

use sqlx::PgPool;

use super::*;
use crate::store::deliveries::Finished;

/// How routing, a redelivery and a relay's reconciliation add to a run's
/// lane (`INSERT INTO delivery_lanes … ORDER BY run_id, sink` before it),
/// each row's `first_pending` the earliest of the deliveries it adds: a
/// lane with nothing pending is woken and takes its place from them, one
/// already due or leased keeps its time, and its place unless they come
/// before it (a redelivered dead letter). Either way the row stays locked
/// until the commit, which is what keeps a concurrent record of results
/// from leaving it empty under a new delivery (ADR 0038); the rows come in
/// key order, as every lock of lanes takes them.
macro_rules! wake_lanes {
    () => {
        "ON CONFLICT (run_id, sink) DO UPDATE
         SET due_at = COALESCE(delivery_lanes.due_at, EXCLUDED.due_at),
             first_pending = LEAST(delivery_lanes.first_pending, EXCLUDED.first_pending)
         WHERE delivery_lanes.due_at IS NULL OR delivery_lanes.first_pending IS NULL
            OR EXCLUDED.first_pending < delivery_lanes.first_pending"
    };
}

/// The queue carries each event's run and name (migration 0027): the
/// outbox is not read.
pub(super) async fn unrouted(pool: &PgPool, limit: usize) -> Result<Vec<UnroutedEvent>> {
    let rows: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT id, run_id, event FROM outbox_unrouted ORDER BY id LIMIT $1")
            .bind(limit as i64)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(UnroutedEvent::from).collect())
}

/// Events a relay routes per transaction: a page locks the lanes of its
/// runs once whatever its size, and at 512 routing was what the relay
/// waited on (ADR 0039).
pub(super) const ROUTE_PAGE: usize = 2048;

/// Routes the next page in one statement ([`ROUTE`]) and commits it;
/// returns how many events it took.
pub(super) async fn route(store: &PostgresStore, r: &Routing) -> Result<usize> {
    let mut tx = begin_bookkeeping(store).await?;
    let row = bind_route(sqlx::query(ROUTE), r)
        .fetch_one(&mut *tx)
        .await?;
    let taken: i64 = sqlx::Row::try_get(&row, 0)?;
    tx.commit().await?;
    Ok(taken as usize)
}

/// Takes the page, the queue's lowest ids, out of the queue of unrouted
/// events (migration 0023) with each event's run and name (migration
/// 0027), so the deliveries it inserts are of events this transaction
/// took: a relay routing the same page waits for the commit and then finds
/// them gone, and the deliveries need no check for a conflict (an `ON
/// CONFLICT` insert writes each row twice to the log). Which sinks take an
/// event is asked once per name in the page, of the sinks' patterns as
/// `LIKE` patterns ($2, $3: a sink and one of its patterns a row). Each
/// run's lane for the sink is made, or woken if it had nothing pending,
/// and locked until the commit (migration 0025).
///
/// The page is every row the queue shows between its lowest id and its
/// `$1`-th, read by key: with the queue's statistics stale (it fills and
/// empties quickly), a page looked up by its list of ids was planned as a
/// walk over the whole queue.
const ROUTE: &str = concat!(
    "WITH page AS (SELECT id FROM outbox_unrouted ORDER BY id LIMIT $1),
     taken AS (
         DELETE FROM outbox_unrouted
         WHERE id BETWEEN (SELECT min(id) FROM page) AND (SELECT max(id) FROM page)
         RETURNING id, run_id, event),
     takes AS (
         SELECT DISTINCT n.event, p.sink
         FROM (SELECT DISTINCT event FROM taken) n
              JOIN UNNEST($2::TEXT[], $3::TEXT[]) AS p (sink, pattern)
              ON n.event LIKE p.pattern),
     routed AS (
         SELECT t.id AS e, k.sink AS s, t.run_id AS r
         FROM taken t JOIN takes k ON k.event = t.event),
     lanes AS (
         INSERT INTO delivery_lanes (run_id, sink, due_at, first_pending)
         SELECT r, s, $4::BIGINT, min(e) FROM routed
         GROUP BY r, s
         ORDER BY r, s ",
    wake_lanes!(),
    "),
     delivered AS (
         INSERT INTO deliveries (outbox_id, sink, run_id, state, next_at, retrying_since,
                                 created_at)
         SELECT e, s, r, 'pending', $4, $4, $4 FROM routed)
     SELECT count(*) FROM taken"
);

fn bind_route<'q>(query: PgQuery<'q>, r: &'q Routing) -> PgQuery<'q> {
    let (sinks, patterns): (Vec<&str>, Vec<String>) = r
        .sinks
        .iter()
        .flat_map(|s| s.events.iter().map(|p| (s.sink.as_str(), p.to_like())))
        .unzip();
    query
        .bind(r.page as i64)
        .bind(sinks)
        .bind(patterns)
        .bind(r.now)
}

/// A write transaction of the relay's bookkeeping, whose commit does not
/// wait for the disk (ADR 0024): losing it in a server crash only sends an
/// event again under its dedup key. Both statements go in one round trip.
async fn begin_bookkeeping(store: &PostgresStore) -> Result<Tx> {
    Ok(store
        .pool
        .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
        .await?)
}

pub(super) async fn finish_then_claim(
    store: &PostgresStore,
    finished: &[DeliveryFinish],
    claim: Option<&DeliveryClaim>,
) -> Result<(Vec<bool>, Vec<ClaimedDelivery>)> {
    let mut tx = begin_bookkeeping(store).await?;
    let recorded = if finished.is_empty() {
        Vec::new()
    } else {
        finish(&mut tx, finished).await?
    };
    let claimed = match claim {
        Some(c) => self::claim(&mut tx, c).await?,
        None => Vec::new(),
    };
    tx.commit().await?;
    Ok((recorded, claimed))
}

/// The due lanes no one holds, each with its run's earliest pending
/// delivery, looked up from the lane's place (migrations 0025 and 0026).
/// Only a span's head records the lease (`DeliveryLease`), and its lane is
/// due again when the lease ends; a lane whose first delivery is not yet
/// due waits for it. A lane with nothing pending (only a concurrent change
/// makes one) is looked at again when a lease would have ended: setting it
/// empty here could miss a delivery committed since this statement's
/// snapshot, which recording results, holding the lane first, never
/// misses. The statement reads the rows as they were before, so
/// `attempts` adds the claim's. A span carries the columns it returns (no
/// second lookup of each row), and the heads are leased by their keys: a
/// join with them, estimated small, was planned as a walk over the whole
/// table.
const CLAIM: &str = "WITH lanes AS (
             SELECT l.run_id, l.sink, l.first_pending FROM delivery_lanes l
             WHERE l.sink = ANY($4) AND l.due_at <= $2
             ORDER BY l.due_at
             LIMIT $5
             FOR UPDATE SKIP LOCKED),
         firsts AS (
             SELECT l.run_id, l.sink, f.id, f.outbox_id, f.attempts,
                    f.next_at <= $2 AND COALESCE(f.lease_expires_at <= $2, TRUE) AS due,
                    GREATEST(f.next_at, f.lease_expires_at) AS due_at
             FROM lanes l LEFT JOIN LATERAL (
                 SELECT e.id, e.outbox_id, e.attempts, e.next_at, e.lease_expires_at
                 FROM deliveries e
                 WHERE e.run_id = l.run_id AND e.sink = l.sink
                   AND e.outbox_id >= l.first_pending AND e.state = 'pending'
                 ORDER BY e.outbox_id
                 LIMIT 1) f ON TRUE),
         heads AS (SELECT id, run_id, sink, outbox_id, attempts FROM firsts WHERE due),
         spans AS (
             SELECT n.id, n.sink, n.outbox_id, n.attempts, n.retrying_since,
                    h.id AS lease_holder, h.attempts + 1 AS lease_attempts,
                    count(*) FILTER (WHERE n.next_at > $2 OR n.lease_expires_at > $2)
                        OVER (PARTITION BY n.run_id, n.sink ORDER BY n.outbox_id) AS held
             FROM heads h CROSS JOIN LATERAL (
                 SELECT e.id, e.run_id, e.sink, e.outbox_id, e.next_at, e.lease_expires_at,
                        e.attempts, e.retrying_since
                 FROM deliveries e
                 WHERE e.state = 'pending' AND e.run_id = h.run_id AND e.sink = h.sink
                   AND e.outbox_id >= h.outbox_id
                 ORDER BY e.outbox_id
                 LIMIT $6) n),
         leased AS (
             UPDATE deliveries d SET lease_owner = $1, lease_expires_at = $2 + $3,
                    attempts = d.attempts + 1
             WHERE d.id = ANY(ARRAY(SELECT id FROM heads))),
         relaned AS (
             UPDATE delivery_lanes l
             SET due_at = CASE WHEN f.due THEN $2 + $3 ELSE COALESCE(f.due_at, $2 + $3) END
             FROM firsts f
             WHERE l.run_id = f.run_id AND l.sink = f.sink)
         SELECT o.id, o.dedup_key, o.run_id, o.stage, o.event, o.payload, o.created_at,
                s.id AS delivery_id, s.sink, s.attempts + 1 AS attempts,
                s.retrying_since, s.lease_holder, s.lease_attempts
         FROM spans s JOIN outbox o ON o.id = s.outbox_id
         WHERE s.held = 0";

fn bind_claim<'q>(query: PgQuery<'q>, c: &'q DeliveryClaim) -> PgQuery<'q> {
    query
        .bind(&c.relay)
        .bind(c.now)
        .bind(c.lease_ms)
        .bind(&c.sinks)
        .bind(c.runs as i64)
        .bind(c.per_run as i64)
}

async fn claim(tx: &mut Tx, c: &DeliveryClaim) -> Result<Vec<ClaimedDelivery>> {
    let rows = bind_claim(sqlx::query(CLAIM), c)
        .fetch_all(&mut **tx)
        .await?;
    let mut claimed = rows
        .iter()
        .map(rows::claimed_delivery)
        .collect::<Result<Vec<_>>>()?;
    claimed.sort_by(|a, b| (a.event.id, &a.sink).cmp(&(b.event.id, &b.sink)));
    Ok(claimed)
}

impl PostgresStore {
    /// What a relay's claim does for `c` on the data there is now
    /// (`explained`): nothing is claimed.
    pub async fn explain_delivery_claim(&self, c: &DeliveryClaim) -> Result<serde_json::Value> {
        explained(self, CLAIM, |q| bind_claim(q, c)).await
    }

    /// What routing `r` does on the data there is now (`explained`):
    /// nothing is routed.
    pub async fn explain_routing(&self, r: &Routing) -> Result<serde_json::Value> {
        explained(self, ROUTE, |q| bind_route(q, r)).await
    }

    /// What counting the deliveries pending for each sink, counting those
    /// pending and dead for the metrics, and listing every run's pending
    /// deliveries and dead letters read on the data there is now
    /// (`explained`): the four plans.
    pub async fn explain_delivery_reports(&self) -> Result<[serde_json::Value; 4]> {
        let every_run = |state| DeliveryFilter {
            run_id: None,
            state: Some(state),
        };
        Ok([
            explained(self, PENDING_BY_SINK, |q| q).await?,
            explained(self, COUNTS, |q| q).await?,
            self.explain_listing(&every_run(DeliveryState::Pending))
                .await?,
            self.explain_listing(&every_run(DeliveryState::Dead))
                .await?,
        ])
    }

    /// What listing `f`'s deliveries reads (`explained`).
    async fn explain_listing(&self, f: &DeliveryFilter) -> Result<serde_json::Value> {
        let (sql, values) = listing(f);
        explained(self, sql, |q| bind_all(q, values)).await
    }

    /// What recording `finished` (results sent under the leases of their
    /// holders) does to the deliveries on the data there is now
    /// (`explained`): nothing is recorded.
    pub async fn explain_delivery_results(
        &self,
        finished: &[DeliveryFinish],
    ) -> Result<serde_json::Value> {
        let rows: Vec<Finished<'_>> = finished.iter().map(Finished::of).collect();
        let holders = lease_holders(finished);
        explained(self, RESULTS, |q| {
            bind_results(q, finished, &rows, &holders)
        })
        .await
    }
}

/// The results, each row's columns as arrays, recorded where the row's
/// lease holder (one of `holders`) still has the lease. The holders are
/// read first, once each, by their keys, and each row is joined to its own
/// (a list of held leases matched with `IN` was planned as a loop over the
/// list for each lease; a join of the rows with the table, as a walk over
/// every delivery the table holds, once per batch).
const RESULTS: &str = "WITH held AS MATERIALIZED (
             SELECT id, attempts, lease_owner FROM deliveries
             WHERE id = ANY($12) AND state = 'pending')
         UPDATE deliveries d SET state = x.state, next_at = COALESCE(x.next_at, d.next_at),
                last_status = CASE WHEN x.unsent THEN d.last_status ELSE x.status END,
                last_error = CASE WHEN x.unsent THEN d.last_error ELSE x.error END,
                delivered_at = x.delivered_at, attempts = x.attempts,
                lease_owner = NULL, lease_expires_at = NULL
         FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::TEXT[], $5::BIGINT[],
                     $6::BIGINT[], $7::BIGINT[], $8::BOOLEAN[], $9::BIGINT[], $10::BIGINT[],
                     $11::TEXT[])
              AS x(state, next_at, status, error, delivered_at, id, attempts, unsent, holder,
                   lease_attempts, relay)
              JOIN held h ON h.id = x.holder AND h.attempts = x.lease_attempts
                         AND h.lease_owner = x.relay
         WHERE d.id = x.id AND d.state = 'pending'
         RETURNING d.id";

fn bind_results<'q>(
    query: PgQuery<'q>,
    finished: &'q [DeliveryFinish],
    rows: &'q [Finished<'q>],
    holders: &'q [i64],
) -> PgQuery<'q> {
    query
        .bind(column(rows, |w| w.state.as_str()))
        .bind(column(rows, |w| w.next_at))
        .bind(column(rows, |w| w.status))
        .bind(column(rows, |w| w.error))
        .bind(column(rows, |w| w.delivered_at))
        .bind(column(finished, |f| f.id))
        .bind(column(rows, |w| w.attempts))
        .bind(column(rows, |w| w.unsent))
        .bind(column(finished, |f| f.lease.holder))
        .bind(column(finished, |f| f.lease.attempts))
        .bind(column(finished, |f| f.relay.as_str()))
        .bind(holders)
}

/// The deliveries holding the leases `finished` was sent under, once each.
/// A lease's holder is in its lane, as is every delivery sent under it.
fn lease_holders(finished: &[DeliveryFinish]) -> Vec<i64> {
    let mut holders: Vec<i64> = finished.iter().map(|f| f.lease.holder).collect();
    holders.sort_unstable();
    holders.dedup();
    holders
}

/// Records the results sent under leases the relay still holds. Their
/// lanes are locked first, in the order of their keys: no claim takes one
/// over, and no routing or redelivery adds to one, until the results are
/// in and each lane is due again when its earliest pending delivery is,
/// which is also its place from then on (migrations 0025 and 0026): the
/// lookup passes only the deliveries this batch finished. Each statement
/// after the lock reads what was committed before it. The results go in
/// one statement ([`RESULTS`]); they write no indexed column, so
/// PostgreSQL updates the rows in place.
async fn finish(tx: &mut Tx, finished: &[DeliveryFinish]) -> Result<Vec<bool>> {
    let holders = lease_holders(finished);
    let lanes: Vec<(String, String)> = sqlx::query_as(
        "SELECT l.run_id, l.sink FROM delivery_lanes l
         WHERE (l.run_id, l.sink) IN (
             SELECT d.run_id, d.sink FROM deliveries d WHERE d.id = ANY($1))
         ORDER BY l.run_id, l.sink
         FOR UPDATE OF l",
    )
    .bind(&holders)
    .fetch_all(&mut **tx)
    .await?;
    let rows: Vec<Finished<'_>> = finished.iter().map(Finished::of).collect();
    let updated: HashSet<i64> = bind_results(sqlx::query(RESULTS), finished, &rows, &holders)
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|row| sqlx::Row::try_get::<i64, _>(row, 0))
        .collect::<std::result::Result<_, _>>()?;
    sqlx::query(
        "UPDATE delivery_lanes l SET (first_pending, due_at) = (
             SELECT e.outbox_id, GREATEST(e.next_at, e.lease_expires_at) FROM deliveries e
             WHERE e.run_id = l.run_id AND e.sink = l.sink
               AND e.outbox_id >= COALESCE(l.first_pending, 0) AND e.state = 'pending'
             ORDER BY e.outbox_id
             LIMIT 1)
         FROM UNNEST($1::TEXT[], $2::TEXT[]) AS k(run_id, sink)
         WHERE l.run_id = k.run_id AND l.sink = k.sink",
    )
    .bind(column(&lanes, |l| l.0.as_str()))
    .bind(column(&lanes, |l| l.1.as_str()))
    .execute(&mut **tx)
    .await?;
    keep_dead_letters(tx, finished, &rows, &updated).await?;
    Ok(finished.iter().map(|f| updated.contains(&f.id)).collect())
}

/// Adds the dead letters this batch recorded to `dead_deliveries`
/// (migration 0028), where they are counted and found; a batch without
/// one (nearly every batch) sends no statement.
async fn keep_dead_letters(
    tx: &mut Tx,
    finished: &[DeliveryFinish],
    rows: &[Finished<'_>],
    updated: &HashSet<i64>,
) -> Result<()> {
    let dead: Vec<i64> = finished
        .iter()
        .zip(rows)
        .filter(|(f, row)| row.state == DeliveryState::Dead && updated.contains(&f.id))
        .map(|(f, _)| f.id)
        .collect();
    if !dead.is_empty() {
        sqlx::query(
            "INSERT INTO dead_deliveries (id, sink)
             SELECT id, sink FROM deliveries WHERE id = ANY($1)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&dead)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A run's deliveries are found by their key, which starts with the run
/// (migration 0026).
pub(super) async fn list(pool: &PgPool, f: &DeliveryFilter) -> Result<Vec<DeliveryRow>> {
    let (sql, values) = listing(f);
    let rows = bind_all(sqlx::query(sql), values).fetch_all(pool).await?;
    rows.iter().map(rows::delivery_row).collect()
}

fn bind_all<'q>(mut query: PgQuery<'q>, values: Vec<Option<&'q str>>) -> PgQuery<'q> {
    for value in values {
        query = query.bind(value);
    }
    query
}

/// The statement that lists `f`'s deliveries, and its values. A run's are
/// read apart from every run's, not with `run IS NULL OR`: a generic plan
/// of that walks every event, and the audit lists each run's. Every run's
/// pending and dead are read from their lanes and the dead letters' table.
fn listing(f: &DeliveryFilter) -> (&'static str, Vec<Option<&str>>) {
    let state = f.state.map(DeliveryState::as_str);
    match (&f.run_id, f.state) {
        (None, Some(DeliveryState::Dead)) => (DEAD_LETTERS, vec![]),
        (None, Some(DeliveryState::Pending)) => (PENDING, vec![]),
        (Some(run), _) => (
            "SELECT d.*, o.dedup_key, o.event, o.stage
             FROM deliveries d JOIN outbox o ON o.id = d.outbox_id
             WHERE d.run_id = $1 AND ($2::TEXT IS NULL OR d.state = $2)
             ORDER BY d.outbox_id, d.sink",
            vec![Some(run.as_str()), state],
        ),
        (None, _) => (
            "SELECT d.*, o.dedup_key, o.event, o.stage
             FROM deliveries d JOIN outbox o ON o.id = d.outbox_id
             WHERE $1::TEXT IS NULL OR d.state = $1
             ORDER BY d.outbox_id, d.sink",
            vec![state],
        ),
    }
}

/// Every dead letter, read by key from the dead letters' table (migration
/// 0028): `ratchet outbox --state dead`.
const DEAD_LETTERS: &str = "SELECT d.*, o.dedup_key, o.event, o.stage
         FROM deliveries d JOIN outbox o ON o.id = d.outbox_id
         WHERE d.id = ANY(ARRAY(SELECT id FROM dead_deliveries)) AND d.state = 'dead'
         ORDER BY d.outbox_id, d.sink";

/// Every pending delivery, read by key from the places of the lanes that
/// have any, as [`PENDING_BY_SINK`] counts them: `ratchet outbox --state
/// pending`. `OFFSET 0` keeps each lane's read apart: joined with the lanes
/// as a whole, the deliveries were planned as one walk over the table.
const PENDING: &str = "SELECT d.*, o.dedup_key, o.event, o.stage
         FROM delivery_lanes l CROSS JOIN LATERAL (
             SELECT * FROM deliveries d
             WHERE d.run_id = l.run_id AND d.sink = l.sink
               AND d.outbox_id >= COALESCE(l.first_pending, 0) AND d.state = 'pending'
             OFFSET 0) d
         JOIN outbox o ON o.id = d.outbox_id
         WHERE l.due_at IS NOT NULL
         ORDER BY d.outbox_id, d.sink";

/// Reads every delivery once, a run's or all: a plan for either
/// (`$1 IS NULL OR`) walks the table.
pub(super) async fn orphaned(pool: &PgPool, run: Option<&str>) -> Result<Vec<OrphanDelivery>> {
    let rows: Vec<(i64, i64, String, String)> = sqlx::query_as(
        "SELECT d.id, d.outbox_id, d.sink, d.run_id FROM deliveries d
         WHERE ($1::TEXT IS NULL OR d.run_id = $1)
           AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = d.outbox_id)
         ORDER BY d.id",
    )
    .bind(run)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(OrphanDelivery::from).collect())
}

/// Dead deliveries the dead letters' table does not list, then the table's
/// rows whose delivery is not dead or gone (migration 0028). Reads every
/// delivery once, as [`orphaned`] does.
pub(super) async fn dead_misfiled(
    pool: &PgPool,
    run: Option<&str>,
) -> Result<Vec<MisfiledDeadLetter>> {
    type Row = (i64, String, Option<String>, Option<String>, bool);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT d.id, d.sink, d.run_id, d.state, false FROM deliveries d
         WHERE d.state = 'dead' AND ($1::TEXT IS NULL OR d.run_id = $1)
           AND NOT EXISTS (SELECT 1 FROM dead_deliveries x WHERE x.id = d.id)
         UNION ALL
         SELECT x.id, x.sink, d.run_id, d.state, true
         FROM dead_deliveries x LEFT JOIN deliveries d ON d.id = x.id
         WHERE d.state IS DISTINCT FROM 'dead' AND ($1::TEXT IS NULL OR d.run_id = $1)
         ORDER BY 1",
    )
    .bind(run)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, sink, run_id, state, listed)| MisfiledDeadLetter {
            id,
            sink,
            run_id,
            state: state.as_deref().and_then(DeliveryState::parse),
            listed,
        })
        .collect())
}

/// Pending deliveries by sink, counted in the lanes that have any
/// (`PENDING_BY_SINK`).
pub(super) async fn pending_by_sink(pool: &PgPool) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(PENDING_BY_SINK).fetch_all(pool).await?)
}

/// Each lane that has a pending delivery (due at some time, migration
/// 0025) with the count of its pending deliveries (`n.pending`), read by
/// key from the lane's place (migration 0026): what it reads grows with
/// what is pending, not with every delivery ever made, which no index of
/// pending ones alone could spare (migration 0028).
macro_rules! pending_in_lanes {
    () => {
        "FROM delivery_lanes l CROSS JOIN LATERAL (
             SELECT count(*) AS pending FROM deliveries d
             WHERE d.run_id = l.run_id AND d.sink = l.sink
               AND d.outbox_id >= COALESCE(l.first_pending, 0) AND d.state = 'pending') n
         WHERE l.due_at IS NOT NULL"
    };
}

const PENDING_BY_SINK: &str = concat!(
    "SELECT l.sink, sum(n.pending)::BIGINT ",
    pending_in_lanes!(),
    " GROUP BY l.sink HAVING sum(n.pending) > 0 ORDER BY l.sink"
);

/// The pending deliveries' count, as [`PENDING_BY_SINK`] counts them, and
/// the dead letters' (migration 0028), for the metrics' gauges.
pub(super) async fn counts(pool: &PgPool) -> Result<(i64, i64)> {
    Ok(sqlx::query_as(COUNTS).fetch_one(pool).await?)
}

const COUNTS: &str = concat!(
    "SELECT (SELECT COALESCE(sum(n.pending), 0)::BIGINT ",
    pending_in_lanes!(),
    ") AS pending, (SELECT count(*) FROM dead_deliveries) AS dead"
);

/// Takes the dead letters out of `dead_deliveries` (migration 0028) and
/// makes them pending again, each by its key. Wakes their lanes, as
/// routing does, and holds them until the commit (migration 0025).
pub(super) async fn redeliver(store: &PostgresStore, r: Redeliver, now: i64) -> Result<u64> {
    let n: i64 = sqlx::query_scalar(concat!(
        "WITH revived AS (
             DELETE FROM dead_deliveries WHERE $2::BIGINT IS NULL OR id = $2 RETURNING id),
         again AS (
             UPDATE deliveries SET state = 'pending', attempts = 0, next_at = $1,
                    retrying_since = $1, lease_owner = NULL, lease_expires_at = NULL
             WHERE id = ANY(ARRAY(SELECT id FROM revived)) AND state = 'dead'
             RETURNING run_id, sink, outbox_id),
         lanes AS (
             INSERT INTO delivery_lanes (run_id, sink, due_at, first_pending)
             SELECT run_id, sink, $1::BIGINT, min(outbox_id) FROM again
             GROUP BY run_id, sink
             ORDER BY run_id, sink ",
        wake_lanes!(),
        ")
         SELECT count(*) FROM again"
    ))
    .bind(now)
    .bind(r.only())
    .fetch_one(&store.pool)
    .await?;
    Ok(n as u64)
}

/// The lanes of runs with pending deliveries, made where missing and woken
/// where empty, each due when its earliest pending delivery is and placed
/// at it, locked in the order of their keys as routing locks them. Reads
/// every delivery once: no index is of pending ones alone (migration 0026).
pub(super) async fn reconcile(pool: &PgPool) -> Result<u64> {
    Ok(sqlx::query(concat!(
        "INSERT INTO delivery_lanes (run_id, sink, due_at, first_pending)
         SELECT DISTINCT ON (run_id, sink) run_id, sink, GREATEST(next_at, lease_expires_at),
                outbox_id
         FROM deliveries
         WHERE state = 'pending'
         ORDER BY run_id, sink, outbox_id ",
        wake_lanes!()
    ))
    .execute(pool)
    .await?
    .rows_affected())
}
