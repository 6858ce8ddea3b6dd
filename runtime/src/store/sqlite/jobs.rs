//! `jobs`, `edges` and `attempts`: claim, leases, summaries (completions
//! are in `complete.rs`, failures in `fail.rs`, reconcile in
//! `reconcile.rs`).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use sqlx::Row;

use super::*;
use crate::store::caps::{self, CappedClaimTx};

pub(super) async fn list<'e>(
    ex: impl sqlx::Executor<'e, Database = Sqlite>,
    run_id: Option<&str>,
) -> Result<Vec<JobRow>> {
    let rows = sqlx::query("SELECT * FROM jobs WHERE (?1 IS NULL OR run_id = ?1) ORDER BY id")
        .bind(run_id)
        .fetch_all(ex)
        .await?;
    rows.iter().map(rows::job_row).collect()
}

/// The jobs a claim takes, in claim order: expired leases with attempts
/// left first (a dead worker's jobs), then ready jobs, oldest due first,
/// each part walking `jobs_live` in its order (one query with an `OR` of
/// both sorted every due job on every claim).
static PICK: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT id, attempt, expired FROM (
             SELECT * FROM (SELECT id, attempt, 1 AS expired, lease_expires_at AS due FROM jobs
                            WHERE state = 'running' AND {live}
                              AND lease_expires_at <= ?1 ->> '$.now'
                              AND attempt < max_attempts
                              AND (?1 ->> '$.only_job' IS NULL OR id = ?1 ->> '$.only_job')
                            ORDER BY lease_expires_at, id LIMIT ?1 ->> '$.limit')
             UNION ALL
             SELECT * FROM (SELECT id, attempt, 0 AS expired, next_run_at AS due FROM jobs
                            WHERE state = 'ready' AND {live} AND next_run_at <= ?1 ->> '$.now'
                              AND (?1 ->> '$.only_job' IS NULL OR id = ?1 ->> '$.only_job')
                            ORDER BY next_run_at, id LIMIT ?1 ->> '$.limit'))
         ORDER BY expired DESC, due, id LIMIT ?1 ->> '$.limit'",
        live = live!(),
    )
});

/// Claims up to `c.limit` jobs in one transaction, in one call: the
/// picked jobs ([`PICK`]) go to the writer's scratch table `claim_pick`
/// (`n` counts from 1, in claim order), and the statements after it close
/// the attempts whose leases expired, take the jobs, open their attempts
/// and read back the jobs and their canonical inputs. Each statement reads
/// only `?1`, a JSON document (see `complete.rs`).
static CLAIM: LazyLock<String> = LazyLock::new(|| claim_with(&PICK));

/// The only-job condition of [`PICK`]'s parts, to which a capped claim adds
/// its plugins' digests (`$.digests`).
const ONLY_JOB: &str = "AND (?1 ->> '$.only_job' IS NULL OR id = ?1 ->> '$.only_job')";

/// [`CLAIM`] among the jobs of `$.digests` ([`store::caps`](crate::store)).
static CLAIM_ONLY: LazyLock<String> = LazyLock::new(|| {
    let among = "AND plugin_digest IN (SELECT value FROM json_each(?1 -> '$.digests'))";
    claim_with(&PICK.replace(ONLY_JOB, &format!("{ONLY_JOB} {among}")))
});

/// [`CLAIM`] among the jobs of every digest but `$.digests`.
static CLAIM_EXCEPT: LazyLock<String> = LazyLock::new(|| {
    let among = "AND plugin_digest NOT IN (SELECT value FROM json_each(?1 -> '$.digests'))";
    claim_with(&PICK.replace(ONLY_JOB, &format!("{ONLY_JOB} {among}")))
});

fn claim_with(pick: &str) -> String {
    format!(
        "DELETE FROM temp.claim_pick;

         INSERT INTO temp.claim_pick (id, attempt, expired)
         {pick};

         UPDATE attempts SET outcome = 'lease_expired', finished_at = ?1 ->> '$.now',
                error = 'lease expired before the attempt finished; job taken over'
         FROM temp.claim_pick p
         WHERE p.expired AND attempts.job_id = p.id AND attempts.attempt = p.attempt
           AND attempts.outcome = 'running';

         UPDATE jobs SET state = 'running', attempt = attempt + 1,
                lease_owner = ?1 ->> '$.worker',
                lease_expires_at = ?1 ->> '$.lease_expires_at', updated_at = ?1 ->> '$.now'
         WHERE id IN (SELECT id FROM temp.claim_pick);

         UPDATE counters SET value = value + (SELECT COUNT(*) FROM temp.claim_pick)
         WHERE name = 'seq';

         INSERT INTO attempts (job_id, attempt, run_id, stage, worker, plugin_digest,
                               claim_seq, claimed_at, outcome)
         SELECT j.id, j.attempt, j.run_id, j.stage, ?1 ->> '$.worker', j.plugin_digest,
                (SELECT value FROM counters WHERE name = 'seq')
                    - (SELECT MAX(n) FROM temp.claim_pick) + p.n,
                ?1 ->> '$.now', 'running'
         FROM temp.claim_pick p CROSS JOIN jobs j ON j.id = p.id;

         SELECT 'job' AS kind, p.n AS claimed, j.id, j.run_id, j.stage, j.plugin_digest,
                j.attempt, j.max_attempts, j.outputs, j.emits, j.lists, p.expired
         FROM temp.claim_pick p CROSS JOIN jobs j ON j.id = p.id
         ORDER BY p.n;

         SELECT 'input' AS kind, p.n AS claimed, {inputs}
         FROM temp.claim_pick p CROSS JOIN jobs j ON j.id = p.id
         CROSS JOIN job_inputs b ON b.run_id = j.run_id AND b.stage = j.stage
         {artifact}
         ORDER BY p.n, b.input",
        inputs = artifacts::INPUT_COLUMNS,
        artifact = artifacts::ARTIFACT_OF_INPUT,
    )
}

impl SqliteStore {
    /// How SQLite picks the jobs of a claim, one line per step of `EXPLAIN
    /// QUERY PLAN`: for checking that both parts walk the live jobs' index.
    pub async fn explain_claim(&self) -> Result<Vec<String>> {
        let claim = serde_json::json!({"now": 0, "only_job": null, "limit": 1});
        let sql = format!("EXPLAIN QUERY PLAN {}", PICK.as_str());
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(claim.to_string())
            .fetch_all(&self.pool)
            .await?;
        Ok(plan.into_iter().map(|(.., detail)| detail).collect())
    }
}

pub(super) async fn claim_tx(tx: &mut Tx<'_>, c: &JobClaim) -> Result<Vec<ClaimedJob>> {
    if c.caps.is_empty() {
        claim_among(tx, c, &CLAIM, &[]).await
    } else {
        caps::claim(&mut Capped(tx), c).await
    }
}

/// The statements of `store::caps` on the writer's transaction: the one
/// writer already holds off every other claim.
struct Capped<'t, 'c>(&'t mut Tx<'c>);

impl CappedClaimTx for Capped<'_, '_> {
    async fn cap_lock(&mut self, _plugin: &str) -> Result<()> {
        Ok(())
    }

    async fn plugin_digests(&mut self, plugin: &str) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT digest FROM plugins WHERE name = ?")
                .bind(plugin)
                .fetch_all(&mut **self.0)
                .await?,
        )
    }

    async fn running(&mut self, digests: &[String], now: i64) -> Result<i64> {
        Ok(sqlx::query_scalar(concat!(
            "SELECT COUNT(*) FROM jobs WHERE state = 'running' AND ",
            live!(),
            " AND lease_expires_at > ?1
              AND plugin_digest IN (SELECT value FROM json_each(?2))"
        ))
        .bind(now)
        .bind(to_json(&digests))
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
        claim_among(self.0, c, sql, digests).await
    }
}

/// Runs `sql`, a claim ([`CLAIM`] or one of its variants among `digests`).
async fn claim_among(
    tx: &mut Tx<'_>,
    c: &JobClaim,
    sql: &str,
    digests: &[String],
) -> Result<Vec<ClaimedJob>> {
    let (claimed_at, lease_expires_at) = (c.now, c.now + c.lease_ms);
    let claim = serde_json::json!({
        "now": c.now,
        "only_job": c.only_job,
        "limit": c.limit.max(1),
        "worker": c.worker,
        "lease_expires_at": lease_expires_at,
        "digests": digests,
    });
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(claim.to_string())
        .fetch_all(&mut **tx)
        .await?;
    let mut claimed = rows::ClaimedRows::default();
    for row in &rows {
        let n: i64 = row.try_get("claimed")?;
        match row.try_get::<String, _>("kind")?.as_str() {
            "job" => {
                let mut job =
                    rows::claimed_job(row, row.try_get("id")?, (claimed_at, lease_expires_at))?;
                job.taken_over = row.try_get::<i64, _>("expired")? == 1;
                claimed.job(n, job);
            }
            "input" => claimed.input(n, rows::loaded_input(row)?)?,
            kind => return Err(rows::unknown_kind("jobs", kind)),
        }
    }
    Ok(claimed.into_jobs())
}

pub(super) async fn leased_to(pool: &sqlx::SqlitePool, worker: &str) -> Result<Vec<ClaimedJob>> {
    let rows = sqlx::query(concat!(
        "SELECT id, run_id, stage, plugin_digest, attempt, max_attempts, outputs, emits, lists,
                lease_expires_at, updated_at
         FROM jobs WHERE state = 'running' AND ",
        live!(),
        " AND lease_owner = ? ORDER BY id"
    ))
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

/// One statement reading `?1`, a JSON document (see `complete.rs`); the
/// attempts are few (at most a worker's slots) and the job's own is found
/// by its id.
pub(super) async fn renew(store: &SqliteStore, r: LeaseRenewal) -> Result<u64> {
    if r.attempts.is_empty() {
        return Ok(0);
    }
    let doc = serde_json::json!({
        "worker": r.worker,
        "until": r.lease_expires_at,
        "attempts": r.attempts,
    });
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let renewed = sqlx::query(
        "UPDATE jobs SET lease_expires_at = ?1 ->> '$.until'
         WHERE id IN (SELECT value ->> 0 FROM json_each(?1, '$.attempts'))
           AND attempt = (SELECT a.value ->> 1 FROM json_each(?1, '$.attempts') AS a
                          WHERE a.value ->> 0 = jobs.id)
           AND state = 'running' AND lease_owner = ?1 ->> '$.worker'
           AND lease_expires_at < ?1 ->> '$.until'",
    )
    .bind(doc.to_string())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    store.commit(tx).await?;
    Ok(renewed)
}

pub(super) async fn gauges(pool: &SqlitePool, now: i64) -> Result<QueueGauges> {
    let row = sqlx::query(concat!(
        "SELECT
           (SELECT COUNT(*) FROM jobs WHERE state = 'ready' AND ",
        live!(),
        " AND next_run_at <= ?1) AS ready,
           (SELECT MIN(next_run_at) FROM jobs WHERE state = 'ready' AND ",
        live!(),
        " AND next_run_at <= ?1) AS oldest,
           (SELECT COUNT(*) FROM jobs WHERE state = 'running' AND ",
        live!(),
        ") AS running,
           (SELECT COUNT(*) FROM deliveries WHERE state = 'pending') AS pending,
           (SELECT COUNT(*) FROM deliveries WHERE state = 'dead') AS dead"
    ))
    .bind(now)
    .fetch_one(pool)
    .await?;
    Ok(QueueGauges {
        ready: row.try_get("ready")?,
        running: row.try_get("running")?,
        oldest_ready_at: row.try_get("oldest")?,
        deliveries_pending: row.try_get("pending")?,
        deliveries_dead: row.try_get("dead")?,
    })
}

pub(super) async fn summary(store: &SqliteStore, now: i64) -> Result<JobSummary> {
    let rows = sqlx::query(concat!(
        "SELECT state, COUNT(*) AS n FROM jobs WHERE ",
        live!(),
        " AND state IN ('ready', 'running') GROUP BY state"
    ))
    .fetch_all(&store.pool)
    .await?;
    let mut counts = BTreeMap::new();
    for row in rows {
        counts.insert(
            row.try_get::<String, _>("state")?,
            row.try_get::<i64, _>("n")?,
        );
    }
    let next_due_at: Option<i64> = sqlx::query_scalar(concat!(
        "SELECT MIN(t) FROM (
             SELECT MIN(next_run_at) AS t FROM jobs WHERE state = 'ready' AND ",
        live!(),
        " AND next_run_at > ?1
             UNION ALL
             SELECT MIN(lease_expires_at) FROM jobs WHERE state = 'running' AND ",
        live!(),
        " AND lease_expires_at > ?1)"
    ))
    .bind(now)
    .fetch_one(&store.pool)
    .await?;
    let lapsed_on_last_attempt: i64 = sqlx::query_scalar(concat!(
        "SELECT COUNT(*) FROM jobs WHERE state = 'running' AND ",
        live!(),
        " AND lease_expires_at <= ? AND attempt >= max_attempts"
    ))
    .bind(now)
    .fetch_one(&store.pool)
    .await?;
    Ok(JobSummary {
        counts,
        next_due_at,
        lapsed_on_last_attempt,
    })
}
