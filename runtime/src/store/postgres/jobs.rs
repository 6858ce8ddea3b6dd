//! `jobs`, `edges` and `attempts`: claim, fail, reconcile (completions are
//! in `complete.rs`, locking in the order `store::complete` gives).

use std::collections::BTreeMap;

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::*;

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

/// Claims up to `c.limit` jobs in one transaction: expired leases with
/// attempts left first (a dead worker's jobs), then ready jobs, oldest due
/// first; rows another claimer holds are skipped, not waited for.
pub(super) async fn claim_tx(tx: &mut Tx, c: &JobClaim) -> Result<Vec<ClaimedJob>> {
    let limit = c.limit.max(1) as i64;
    let expired: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT id, attempt FROM jobs
         WHERE state = 'running' AND lease_expires_at <= $1 AND attempt < max_attempts
           AND ($2::BIGINT IS NULL OR id = $2)
         ORDER BY lease_expires_at, id LIMIT $3
         FOR UPDATE SKIP LOCKED",
    )
    .bind(c.now)
    .bind(c.only_job)
    .bind(limit)
    .fetch_all(&mut **tx)
    .await?;
    let mut ids: Vec<i64> = expired.iter().map(|(id, _)| *id).collect();
    if ids.len() < limit as usize {
        let ready: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM jobs
             WHERE state = 'ready' AND next_run_at <= $1 AND ($2::BIGINT IS NULL OR id = $2)
             ORDER BY next_run_at, id LIMIT $3
             FOR UPDATE SKIP LOCKED",
        )
        .bind(c.now)
        .bind(c.only_job)
        .bind(limit - ids.len() as i64)
        .fetch_all(&mut **tx)
        .await?;
        ids.extend(ready);
    }
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    if !expired.is_empty() {
        let (jobs, attempts): (Vec<i64>, Vec<i64>) = expired.into_iter().unzip();
        sqlx::query(
            "UPDATE attempts SET outcome = 'lease_expired', finished_at = $1,
                    error = 'lease expired before the attempt finished; job taken over'
             FROM UNNEST($2::BIGINT[], $3::BIGINT[]) AS x(job_id, attempt)
             WHERE attempts.job_id = x.job_id AND attempts.attempt = x.attempt
               AND attempts.outcome = 'running'",
        )
        .bind(c.now)
        .bind(&jobs)
        .bind(&attempts)
        .execute(&mut **tx)
        .await?;
    }
    let lease_expires_at = c.now + c.lease_ms;
    let rows = sqlx::query(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = $1,
                lease_expires_at = $2, updated_at = $3
         WHERE id = ANY($4)
         RETURNING id, run_id, stage, plugin_digest, attempt, max_attempts, outputs, emits",
    )
    .bind(&c.worker)
    .bind(lease_expires_at)
    .bind(c.now)
    .bind(&ids)
    .fetch_all(&mut **tx)
    .await?;
    let mut claimed = rows
        .iter()
        .map(|row| rows::claimed_job(row, row.try_get("id")?, lease_expires_at))
        .collect::<Result<Vec<_>>>()?;
    claimed.sort_by_key(|job| ids.iter().position(|id| *id == job.job_id));
    let column = |f: fn(&ClaimedJob) -> String| claimed.iter().map(f).collect::<Vec<_>>();
    sqlx::query(
        "INSERT INTO attempts (job_id, attempt, run_id, stage, worker, plugin_digest, claim_seq,
                               claimed_at, outcome)
         SELECT job_id, attempt, run_id, stage, $1, plugin_digest, nextval('ratchet_seq'), $2,
                'running'
         FROM UNNEST($3::BIGINT[], $4::BIGINT[], $5::TEXT[], $6::TEXT[], $7::TEXT[])
              AS x(job_id, attempt, run_id, stage, plugin_digest)",
    )
    .bind(&c.worker)
    .bind(c.now)
    .bind(claimed.iter().map(|j| j.job_id).collect::<Vec<_>>())
    .bind(claimed.iter().map(|j| j.attempt).collect::<Vec<_>>())
    .bind(column(|j| j.run_id.clone()))
    .bind(column(|j| j.stage.clone()))
    .bind(column(|j| j.plugin_digest.clone()))
    .execute(&mut **tx)
    .await?;
    Ok(claimed)
}

/// Locks and returns the job row if `(job, attempt, worker)` holds the lease.
pub(super) async fn fence(
    tx: &mut Tx,
    job_id: i64,
    attempt: i64,
    worker: &str,
) -> Result<Option<PgRow>> {
    Ok(sqlx::query(
        "SELECT run_id, stage, plugin_digest, emits, max_attempts FROM jobs
         WHERE id = $1 AND attempt = $2 AND lease_owner = $3 AND state = 'running'
         FOR UPDATE",
    )
    .bind(job_id)
    .bind(attempt)
    .bind(worker)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Dead job, cancelled not-yet-started jobs, failed run: jobs before the
/// run row, as in completion.
async fn kill_job(tx: &mut Tx, job_id: i64, run_id: &str, error: &str, now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE jobs SET state = 'dead', lease_owner = NULL, lease_expires_at = NULL,
                last_error = $1, updated_at = $2
         WHERE id = $3",
    )
    .bind(error)
    .bind(now)
    .bind(job_id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE jobs SET state = 'cancelled', last_error = 'run failed', updated_at = $1
         WHERE run_id = $2 AND state IN ('blocked', 'ready')",
    )
    .bind(now)
    .bind(run_id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE runs SET state = 'failed', finished_at = $1 WHERE id = $2 AND state = 'running'",
    )
    .bind(now)
    .bind(run_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn fail(store: &PostgresStore, f: JobFail) -> Result<FailOutcome> {
    let mut tx = store.begin_write().await?;
    let Some(job) = fence(&mut tx, f.job_id, f.attempt, &f.worker).await? else {
        return Ok(FailOutcome::LeaseLost);
    };
    let run_id: String = job.try_get("run_id")?;
    let max_attempts: i64 = job.try_get("max_attempts")?;
    let outcome = if f.retryable && f.attempt < max_attempts {
        sqlx::query(
            "UPDATE jobs SET state = 'ready', lease_owner = NULL, lease_expires_at = NULL,
                    next_run_at = $1, last_error = $2, updated_at = $3
             WHERE id = $4",
        )
        .bind(f.retry_at)
        .bind(&f.error)
        .bind(f.now)
        .bind(f.job_id)
        .execute(&mut *tx)
        .await?;
        FailOutcome::Retrying { at: f.retry_at }
    } else {
        kill_job(&mut tx, f.job_id, &run_id, &f.error, f.now).await?;
        FailOutcome::Dead
    };
    sqlx::query(
        "UPDATE attempts SET outcome = 'failed', finished_at = $1, error = $2, input_digests = $3
         WHERE job_id = $4 AND attempt = $5",
    )
    .bind(f.now)
    .bind(&f.error)
    .bind(to_json(&f.input_digests))
    .bind(f.job_id)
    .bind(f.attempt)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(outcome)
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
    Ok(JobSummary {
        counts,
        next_due_at,
    })
}

pub(super) async fn reconcile(store: &PostgresStore, now: i64) -> Result<ReconcileReport> {
    let mut tx = store.begin_write().await?;
    let mut report = ReconcileReport::default();
    let exhausted = sqlx::query(
        "SELECT id, run_id, attempt FROM jobs
         WHERE state = 'running' AND lease_expires_at <= $1 AND attempt >= max_attempts
         FOR UPDATE SKIP LOCKED",
    )
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    for row in exhausted {
        let (job_id, run_id, attempt): (i64, String, i64) = (
            row.try_get("id")?,
            row.try_get("run_id")?,
            row.try_get("attempt")?,
        );
        let error = "lease expired on the final attempt (the worker died or hung)";
        sqlx::query(
            "UPDATE attempts SET outcome = 'lease_expired', finished_at = $1, error = $2
             WHERE job_id = $3 AND attempt = $4 AND outcome = 'running'",
        )
        .bind(now)
        .bind(error)
        .bind(job_id)
        .bind(attempt)
        .execute(&mut *tx)
        .await?;
        kill_job(&mut tx, job_id, &run_id, error, now).await?;
        report.dead_expired_leases += 1;
    }
    report.edges_repaired = sqlx::query(
        "UPDATE edges SET satisfied = 1
         WHERE satisfied = 0 AND EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = edges.run_id
                                         AND j.stage = edges.from_stage AND j.state = 'succeeded')",
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    report.pending_repaired = sqlx::query(
        "UPDATE jobs SET pending = (SELECT COUNT(*) FROM edges e WHERE e.run_id = jobs.run_id
                                    AND e.to_stage = jobs.stage AND e.satisfied = 0),
                updated_at = $1
         WHERE state = 'blocked'
           AND pending != (SELECT COUNT(*) FROM edges e WHERE e.run_id = jobs.run_id
                           AND e.to_stage = jobs.stage AND e.satisfied = 0)",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let ready = sqlx::query(
        "UPDATE jobs SET state = 'ready', next_run_at = $1, updated_at = $1
         WHERE state = 'blocked' AND pending = 0",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    report.pending_repaired += ready;
    report.runs_finished = sqlx::query(
        "UPDATE runs SET state = 'succeeded', finished_at = $1
         WHERE state = 'running'
           AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.run_id = runs.id AND jobs.state != 'succeeded')",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if ready > 0 {
        notify_ready(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(report)
}
