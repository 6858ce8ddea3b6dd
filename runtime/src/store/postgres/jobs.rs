//! `jobs`, `edges` and `attempts`: claim, leases, summaries (completions
//! are in `complete.rs`, locking in the order `store::complete` gives;
//! failures in `fail.rs`; reconcile in `reconcile.rs`).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use sqlx::Row;

use super::*;
use crate::store::caps::{self, CappedClaimTx};

pub(super) async fn list<'e>(
    ex: impl sqlx::Executor<'e, Database = Postgres>,
    run_id: Option<&str>,
) -> Result<Vec<JobRow>> {
    let rows =
        sqlx::query("SELECT * FROM jobs WHERE ($1::TEXT IS NULL OR run_id = $1) ORDER BY id")
            .bind(run_id)
            .fetch_all(ex)
            .await?;
    rows.iter().map(rows::job_row).collect()
}

/// The claim statement: `$1` now, `$2` only this job (or NULL), `$3` the
/// limit, `$4` the worker, `$5` the new leases' expiry.
pub(super) const CLAIM: &str = "WITH expired AS (
             SELECT id, attempt, lease_expires_at AS due FROM jobs
             WHERE state = 'running' AND lease_expires_at <= $1 AND attempt < max_attempts
               AND ($2::BIGINT IS NULL OR id = $2)
             ORDER BY lease_expires_at, id LIMIT $3
             FOR UPDATE SKIP LOCKED
         ), ready AS (
             SELECT id, attempt, next_run_at AS due FROM jobs
             WHERE state = 'ready' AND next_run_at <= $1 AND ($2::BIGINT IS NULL OR id = $2)
             ORDER BY next_run_at, id LIMIT $3
             FOR UPDATE SKIP LOCKED
         ), chosen AS (
             SELECT id, attempt, 0 AS part, due FROM expired
             UNION ALL
             SELECT id, attempt, 1 AS part, due FROM ready
             ORDER BY part, due, id LIMIT $3
         ), taken_over AS (
             UPDATE attempts SET outcome = 'lease_expired', finished_at = $1,
                    error = 'lease expired before the attempt finished; job taken over'
             FROM chosen
             WHERE chosen.part = 0 AND attempts.job_id = chosen.id
               AND attempts.attempt = chosen.attempt AND attempts.outcome = 'running'
         ), claimed AS (
             UPDATE jobs SET state = 'running', attempt = jobs.attempt + 1, lease_owner = $4,
                    lease_expires_at = $5, updated_at = $1
             FROM chosen WHERE jobs.id = chosen.id
             RETURNING jobs.id, jobs.run_id, jobs.stage, jobs.plugin_digest, jobs.attempt,
                       jobs.max_attempts, jobs.outputs, jobs.emits, jobs.lists, chosen.part,
                       chosen.due
         ), opened AS (
             INSERT INTO attempts (job_id, attempt, run_id, stage, worker, plugin_digest,
                                   claim_seq, claimed_at, outcome, deps_seen)
             SELECT id, attempt, run_id, stage, $4, plugin_digest, nextval('ratchet_seq'), $1,
                    'running',
                    (SELECT COUNT(*) FROM edges e
                     WHERE e.run_id = c.run_id AND e.to_stage = c.stage AND e.satisfied = 1)
             FROM (SELECT * FROM claimed ORDER BY part, due, id) AS c
         )
         SELECT id, run_id, stage, plugin_digest, attempt, max_attempts, outputs, emits, lists,
                part = 0 AS taken_over
         FROM claimed ORDER BY part, due, id";

/// Claims up to `c.limit` jobs in one transaction: expired leases with
/// attempts left first (a dead worker's jobs), then ready jobs, oldest due
/// first; rows another claimer holds are skipped, not waited for. One
/// statement: each part walks an index in its order (`jobs_leases`,
/// `jobs_claimable`), and data-modifying `WITH` clauses close the
/// taken-over attempts, take the jobs and open their attempts.
pub(super) async fn claim_tx(tx: &mut Tx, c: &JobClaim) -> Result<Vec<ClaimedJob>> {
    if c.caps.is_empty() {
        let query = bind_claim(sqlx::query(CLAIM), c);
        claim_rows(tx, c, query).await
    } else {
        caps::claim(&mut Capped(tx), c).await
    }
}

async fn claim_rows(tx: &mut Tx, c: &JobClaim, query: PgQuery<'_>) -> Result<Vec<ClaimedJob>> {
    let (claimed_at, lease_expires_at) = (c.now, c.now + c.lease_ms);
    let rows = query.fetch_all(&mut **tx).await?;
    rows.iter()
        .map(|row| {
            let mut job =
                rows::claimed_job(row, row.try_get("id")?, (claimed_at, lease_expires_at))?;
            job.taken_over = row.try_get("taken_over")?;
            Ok(job)
        })
        .collect()
}

/// The only-job condition of [`CLAIM`]'s parts, to which a capped claim
/// adds its plugins' digests (`$6`).
const ONLY_JOB: &str = "AND ($2::BIGINT IS NULL OR id = $2)";

/// [`CLAIM`] among the jobs of the digests `$6` ([`store::caps`](crate::store)).
static CLAIM_ONLY: LazyLock<String> =
    LazyLock::new(|| CLAIM.replace(ONLY_JOB, &format!("{ONLY_JOB} AND plugin_digest = ANY($6)")));

/// [`CLAIM`] among the jobs of every digest but `$6`.
static CLAIM_EXCEPT: LazyLock<String> = LazyLock::new(|| {
    CLAIM.replace(
        ONLY_JOB,
        &format!("{ONLY_JOB} AND plugin_digest <> ALL($6)"),
    )
});

/// The statements of `store::caps` on a write transaction.
struct Capped<'t>(&'t mut Tx);

impl CappedClaimTx for Capped<'_> {
    async fn cap_lock(&mut self, plugin: &str) -> Result<()> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("ratchet concurrency cap of {plugin}"))
            .execute(&mut **self.0)
            .await?;
        Ok(())
    }

    async fn plugin_digests(&mut self, plugin: &str) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT digest FROM plugins WHERE name = $1")
                .bind(plugin)
                .fetch_all(&mut **self.0)
                .await?,
        )
    }

    async fn running(&mut self, digests: &[String], now: i64) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM jobs
             WHERE state = 'running' AND lease_expires_at > $1 AND plugin_digest = ANY($2)",
        )
        .bind(now)
        .bind(digests)
        .fetch_one(&mut **self.0)
        .await?)
    }

    async fn claim_among(
        &mut self,
        c: &JobClaim,
        digests: &[String],
        only: bool,
    ) -> Result<Vec<ClaimedJob>> {
        let sql = if only { &CLAIM_ONLY } else { &CLAIM_EXCEPT };
        let query = bind_claim(sqlx::query(sqlx::AssertSqlSafe(sql.as_str())), c).bind(digests);
        claim_rows(self.0, c, query).await
    }
}

pub(super) fn bind_claim<'q>(query: PgQuery<'q>, c: &'q JobClaim) -> PgQuery<'q> {
    query
        .bind(c.now)
        .bind(c.only_job)
        .bind(c.limit.max(1) as i64)
        .bind(&c.worker)
        .bind(c.now + c.lease_ms)
}

impl PostgresStore {
    /// What the claim statement does for `c` on the data there is now
    /// (`explained`): nothing is claimed.
    pub async fn explain_claim(&self, c: &JobClaim) -> Result<serde_json::Value> {
        explained(self, CLAIM, |q| bind_claim(q, c)).await
    }
}

pub(super) async fn leased_to(pool: &sqlx::PgPool, worker: &str) -> Result<Vec<ClaimedJob>> {
    let rows = sqlx::query(
        "SELECT id, run_id, stage, plugin_digest, attempt, max_attempts, outputs, emits, lists,
                lease_expires_at, updated_at
         FROM jobs WHERE state = 'running' AND lease_owner = $1 ORDER BY id",
    )
    .bind(worker)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            // Set by the claim (a lease renewal leaves it).
            let claimed_at = row.try_get("updated_at")?;
            let (id, lease) = (row.try_get("id")?, row.try_get("lease_expires_at")?);
            rows::claimed_job(row, id, (claimed_at, lease))
        })
        .collect()
}

pub(super) async fn renew(store: &PostgresStore, r: LeaseRenewal) -> Result<u64> {
    if r.attempts.is_empty() {
        return Ok(0);
    }
    let (jobs, attempts): (Vec<i64>, Vec<i64>) = r.attempts.iter().copied().unzip();
    // Rows locked in job id order, as the completion's fence locks them
    // (migration 0006): a renewal and a batch over the same jobs cannot
    // each hold a row the other waits for.
    let renewed = sqlx::query(
        "WITH held AS (
             SELECT j.id FROM jobs j
             JOIN unnest($2::BIGINT[], $3::BIGINT[]) AS k (id, attempt)
               ON j.id = k.id AND j.attempt = k.attempt
             WHERE j.state = 'running' AND j.lease_owner = $4 AND j.lease_expires_at < $1
             ORDER BY j.id
             FOR UPDATE OF j
         )
         UPDATE jobs SET lease_expires_at = $1 FROM held WHERE jobs.id = held.id",
    )
    .bind(r.lease_expires_at)
    .bind(&jobs)
    .bind(&attempts)
    .bind(&r.worker)
    .execute(&store.pool)
    .await?
    .rows_affected();
    Ok(renewed)
}

pub(super) async fn gauges(pool: &sqlx::PgPool, now: i64) -> Result<QueueGauges> {
    let row = sqlx::query(
        "SELECT
           (SELECT COUNT(*) FROM jobs WHERE state = 'ready' AND next_run_at <= $1) AS ready,
           (SELECT MIN(next_run_at) FROM jobs WHERE state = 'ready' AND next_run_at <= $1) AS oldest,
           (SELECT COUNT(*) FROM jobs WHERE state = 'running') AS running",
    )
    .bind(now)
    .fetch_one(pool)
    .await?;
    let (pending, dead) = super::deliveries::counts(pool).await?;
    Ok(QueueGauges {
        ready: row.try_get("ready")?,
        running: row.try_get("running")?,
        oldest_ready_at: row.try_get("oldest")?,
        deliveries_pending: pending,
        deliveries_dead: dead,
    })
}

pub(super) async fn summary(store: &PostgresStore, now: i64) -> Result<JobSummary> {
    let rows = sqlx::query(
        "SELECT state, COUNT(*) AS n FROM jobs WHERE state IN ('ready', 'running') GROUP BY state",
    )
    .fetch_all(&store.pool)
    .await?;
    let mut counts = BTreeMap::new();
    for row in rows {
        counts.insert(
            row.try_get::<String, _>("state")?,
            row.try_get::<i64, _>("n")?,
        );
    }
    let next_due_at: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(t) FROM (
             SELECT MIN(next_run_at) AS t FROM jobs WHERE state = 'ready' AND next_run_at > $1
             UNION ALL
             SELECT MIN(lease_expires_at) FROM jobs WHERE state = 'running' AND lease_expires_at > $1) due",
    )
    .bind(now)
    .fetch_one(&store.pool)
    .await?;
    let lapsed_on_last_attempt: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM jobs
         WHERE state = 'running' AND lease_expires_at <= $1 AND attempt >= max_attempts",
    )
    .bind(now)
    .fetch_one(&store.pool)
    .await?;
    Ok(JobSummary {
        counts,
        next_due_at,
        lapsed_on_last_attempt,
    })
}
