//! `jobs`, `edges` and `attempts`: claim, complete, fail, reconcile.

use std::collections::BTreeMap;

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::*;

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

pub(super) async fn claim(store: &SqliteStore, c: JobClaim) -> Result<Option<ClaimedJob>> {
    let mut tx = store.begin_write().await?;
    let candidate = sqlx::query(
        "SELECT id, state, attempt FROM jobs
         WHERE ((state = 'ready' AND next_run_at <= ?1)
             OR (state = 'running' AND lease_expires_at <= ?1 AND attempt < max_attempts))
           AND (?2 IS NULL OR id = ?2)
         ORDER BY next_run_at, id LIMIT 1",
    )
    .bind(c.now)
    .bind(c.only_job)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(candidate) = candidate else {
        return Ok(None);
    };
    let job_id: i64 = candidate.try_get("id")?;
    let state: String = candidate.try_get("state")?;
    if state == "running" {
        let previous: i64 = candidate.try_get("attempt")?;
        sqlx::query(
            "UPDATE attempts SET outcome = 'lease_expired', finished_at = ?,
                    error = 'lease expired before the attempt finished; job taken over'
             WHERE job_id = ? AND attempt = ? AND outcome = 'running'",
        )
        .bind(c.now)
        .bind(job_id)
        .bind(previous)
        .execute(&mut *tx)
        .await?;
    }
    let lease_expires_at = c.now + c.lease_ms;
    let row = sqlx::query(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = ?,
                lease_expires_at = ?, updated_at = ?
         WHERE id = ?
         RETURNING run_id, stage, plugin_digest, attempt, max_attempts, outputs, emits",
    )
    .bind(&c.worker)
    .bind(lease_expires_at)
    .bind(c.now)
    .bind(job_id)
    .fetch_one(&mut *tx)
    .await?;
    let claimed = rows::claimed_job(&row, job_id, lease_expires_at)?;
    let seq = next_seq(&mut tx).await?;
    sqlx::query(
        "INSERT INTO attempts (job_id, attempt, run_id, stage, worker, plugin_digest, claim_seq,
                               claimed_at, outcome)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running')",
    )
    .bind(job_id)
    .bind(claimed.attempt)
    .bind(&claimed.run_id)
    .bind(&claimed.stage)
    .bind(&c.worker)
    .bind(&claimed.plugin_digest)
    .bind(seq)
    .bind(c.now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(claimed))
}

/// The job row, if `(job, attempt, worker)` still holds the lease.
async fn fence(tx: &mut Tx, job_id: i64, attempt: i64, worker: &str) -> Result<Option<SqliteRow>> {
    Ok(sqlx::query(
        "SELECT run_id, stage, plugin_digest, emits, max_attempts FROM jobs
         WHERE id = ? AND attempt = ? AND lease_owner = ? AND state = 'running'",
    )
    .bind(job_id)
    .bind(attempt)
    .bind(worker)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(super) async fn complete(store: &SqliteStore, mut c: JobComplete) -> Result<CompleteOutcome> {
    let mut tx = store.begin_write().await?;
    let Some(job) = fence(&mut tx, c.job_id, c.attempt, &c.worker).await? else {
        return Ok(CompleteOutcome::LeaseLost);
    };
    let run_id: String = job.try_get("run_id")?;
    let stage: String = job.try_get("stage")?;
    let plugin_digest: String = job.try_get("plugin_digest")?;
    let emits = rows::json_list("jobs", &job.try_get::<String, _>("emits")?)?;

    let mut outputs = Vec::with_capacity(c.outputs.len());
    // The proposals are moved into the insert, never copied.
    for proposed in std::mem::take(&mut c.outputs) {
        let put = ArtifactPut {
            run_id: run_id.clone(),
            stage: stage.clone(),
            output: proposed.name,
            media_type: proposed.media_type,
            bytes: proposed.bytes,
            digest: proposed.digest,
            attempt: c.attempt,
            plugin_digest: Some(plugin_digest.clone()),
            now: c.now,
        };
        let canonical = artifacts::put_canonical_tx(&mut tx, &put).await?;
        outputs.push(CanonicalOutput {
            name: put.output,
            digest: canonical.digest,
            proposed_digest: put.digest,
            won: canonical.inserted,
        });
    }
    crate::crash::point("after_persist");

    let canonical: BTreeMap<&str, &str> = outputs
        .iter()
        .map(|o| (o.name.as_str(), o.digest.as_str()))
        .collect();
    for event in &emits {
        let payload = serde_json::json!({
            "event": event,
            "run_id": run_id,
            "stage": stage,
            "inputs": c.input_digests,
            "outputs": canonical,
        });
        sqlx::query(
            "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
             VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (dedup_key) DO NOTHING",
        )
        .bind(format!("{run_id}/{stage}/{event}"))
        .bind(&run_id)
        .bind(&stage)
        .bind(event)
        .bind(payload.to_string())
        .bind(c.now)
        .execute(&mut *tx)
        .await?;
    }
    crate::crash::point("after_outbox_insert");

    let seq = next_seq(&mut tx).await?;
    sqlx::query(
        "UPDATE jobs SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,
                last_error = NULL, succeeded_seq = ?, updated_at = ?
         WHERE id = ?",
    )
    .bind(seq)
    .bind(c.now)
    .bind(c.job_id)
    .execute(&mut *tx)
    .await?;
    let released = release_dependents(&mut tx, &run_id, &stage, c.now).await?;

    let proposals: BTreeMap<&str, &str> = outputs
        .iter()
        .map(|o| (o.name.as_str(), o.proposed_digest.as_str()))
        .collect();
    sqlx::query(
        "UPDATE attempts SET outcome = 'succeeded', finished_at = ?, input_digests = ?,
                proposal_digests = ?, canonical_digests = ?, proposal_won = ?
         WHERE job_id = ? AND attempt = ?",
    )
    .bind(c.now)
    .bind(to_json(&c.input_digests))
    .bind(to_json(&proposals))
    .bind(to_json(&canonical))
    .bind(outputs.iter().all(|o| o.won))
    .bind(c.job_id)
    .bind(c.attempt)
    .execute(&mut *tx)
    .await?;
    finish_run_if_done(&mut tx, &run_id, c.now).await?;
    tx.commit().await?;
    Ok(CompleteOutcome::Completed { outputs, released })
}

/// Satisfies the edges out of `stage`, takes each dependent's `pending` down
/// by the edges it just got, and makes those at zero ready. Only edges that
/// were unsatisfied count, so running it twice changes nothing; a recount
/// on every completion grew with the number of edges into a join
/// (BENCHMARKS.md). The reconciler's recount repairs any drift, as on
/// Postgres (ADR 0005).
async fn release_dependents(
    tx: &mut Tx,
    run_id: &str,
    stage: &str,
    now: i64,
) -> Result<Vec<String>> {
    let satisfied: Vec<String> = sqlx::query_scalar(
        "UPDATE edges SET satisfied = 1
         WHERE run_id = ? AND from_stage = ? AND satisfied = 0
         RETURNING to_stage",
    )
    .bind(run_id)
    .bind(stage)
    .fetch_all(&mut **tx)
    .await?;
    let mut per_dependent: BTreeMap<String, i64> = BTreeMap::new();
    for to in satisfied {
        *per_dependent.entry(to).or_default() += 1;
    }
    let mut released = Vec::new();
    for (dependent, n) in per_dependent {
        let state: Option<String> = sqlx::query_scalar(
            "UPDATE jobs SET pending = pending - ?1,
                    state = CASE WHEN state = 'blocked' AND pending - ?1 <= 0 THEN 'ready' ELSE state END,
                    next_run_at = CASE WHEN state = 'blocked' AND pending - ?1 <= 0 THEN ?2 ELSE next_run_at END,
                    updated_at = ?2
             WHERE run_id = ?3 AND stage = ?4
             RETURNING state",
        )
        .bind(n)
        .bind(now)
        .bind(run_id)
        .bind(&dependent)
        .fetch_optional(&mut **tx)
        .await?;
        if state.as_deref() == Some("ready") {
            released.push(dependent);
        }
    }
    Ok(released)
}

async fn finish_run_if_done(tx: &mut Tx, run_id: &str, now: i64) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE runs SET state = 'succeeded', finished_at = ?1
         WHERE id = ?2 AND state = 'running'
           AND NOT EXISTS (SELECT 1 FROM jobs WHERE run_id = ?2
                             AND state IN ('blocked', 'ready', 'running', 'failed', 'dead', 'cancelled'))",
    )
    .bind(now)
    .bind(run_id)
    .execute(&mut **tx)
    .await?
    .rows_affected())
}

/// Marks the job dead, the run failed and every job that has not started
/// cancelled: a failed run starts nothing new.
async fn kill_job(tx: &mut Tx, job_id: i64, run_id: &str, error: &str, now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE jobs SET state = 'dead', lease_owner = NULL, lease_expires_at = NULL,
                last_error = ?, updated_at = ?
         WHERE id = ?",
    )
    .bind(error)
    .bind(now)
    .bind(job_id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE runs SET state = 'failed', finished_at = ? WHERE id = ? AND state = 'running'",
    )
    .bind(now)
    .bind(run_id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE jobs SET state = 'cancelled', last_error = 'run failed', updated_at = ?
         WHERE run_id = ? AND state IN ('blocked', 'ready')",
    )
    .bind(now)
    .bind(run_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn fail(store: &SqliteStore, f: JobFail) -> Result<FailOutcome> {
    let mut tx = store.begin_write().await?;
    let Some(job) = fence(&mut tx, f.job_id, f.attempt, &f.worker).await? else {
        return Ok(FailOutcome::LeaseLost);
    };
    let run_id: String = job.try_get("run_id")?;
    let max_attempts: i64 = job.try_get("max_attempts")?;
    let outcome = if f.retryable && f.attempt < max_attempts {
        sqlx::query(
            "UPDATE jobs SET state = 'ready', lease_owner = NULL, lease_expires_at = NULL,
                    next_run_at = ?, last_error = ?, updated_at = ?
             WHERE id = ?",
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
        "UPDATE attempts SET outcome = 'failed', finished_at = ?, error = ?, input_digests = ?
         WHERE job_id = ? AND attempt = ?",
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

pub(super) async fn summary(store: &SqliteStore, now: i64) -> Result<JobSummary> {
    let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
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
             SELECT MIN(next_run_at) AS t FROM jobs WHERE state = 'ready' AND next_run_at > ?1
             UNION ALL
             SELECT MIN(lease_expires_at) FROM jobs WHERE state = 'running' AND lease_expires_at > ?1)",
    )
    .bind(now)
    .fetch_one(&store.pool)
    .await?;
    Ok(JobSummary {
        counts,
        next_due_at,
    })
}

pub(super) async fn reconcile(store: &SqliteStore, now: i64) -> Result<ReconcileReport> {
    let mut tx = store.begin_write().await?;
    let mut report = ReconcileReport::default();
    let exhausted = sqlx::query(
        "SELECT id, run_id, attempt FROM jobs
         WHERE state = 'running' AND lease_expires_at <= ? AND attempt >= max_attempts",
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
            "UPDATE attempts SET outcome = 'lease_expired', finished_at = ?, error = ?
             WHERE job_id = ? AND attempt = ? AND outcome = 'running'",
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
                updated_at = ?1
         WHERE state = 'blocked'
           AND pending != (SELECT COUNT(*) FROM edges e WHERE e.run_id = jobs.run_id
                           AND e.to_stage = jobs.stage AND e.satisfied = 0)",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    report.pending_repaired += sqlx::query(
        "UPDATE jobs SET state = 'ready', next_run_at = ?1, updated_at = ?1
         WHERE state = 'blocked' AND pending = 0",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    report.runs_finished = sqlx::query(
        "UPDATE runs SET state = 'succeeded', finished_at = ?1
         WHERE state = 'running'
           AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.run_id = runs.id AND jobs.state != 'succeeded')",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(report)
}
