//! The statements of a completion (`store::complete`), in SQLite's dialect.

use sqlx::{QueryBuilder, Row};

use super::*;
use crate::store::complete::{
    self, AttemptKey, CompletionTx, EdgeSatisfied, Fenced, Proposal, StoredKey, Success,
};

/// Artifacts per multi-row insert: ten parameters each, far below SQLite's
/// limit on bound parameters.
const ARTIFACT_ROWS_PER_INSERT: usize = 256;

pub(super) async fn batch(store: &SqliteStore, b: &JobBatch) -> Result<JobBatchOutcome> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let completed = complete::complete_many(&mut Completion(&mut tx), &b.completions).await?;
    let claimed = match &b.claim {
        Some(claim) => jobs::claim_tx(&mut tx, claim).await?,
        None => Vec::new(),
    };
    tx.commit().await?;
    Ok(JobBatchOutcome { completed, claimed })
}

struct Completion<'t, 'c>(&'t mut Tx<'c>);

/// The job rows of a batch's attempts that still hold their lease: the
/// keys are a JSON array of `[job, attempt, worker]`. `CROSS JOIN` makes
/// SQLite start from the keys: left to choose, it walked every running job
/// (`jobs_claimable`) and read the whole key list again for each.
const FENCE: &str = "SELECT j.id, j.attempt, j.run_id, j.stage, j.plugin_digest, j.emits
     FROM json_each(?) AS k CROSS JOIN jobs j ON j.id = k.value ->> 0
     WHERE j.attempt = k.value ->> 1 AND j.lease_owner = k.value ->> 2
       AND j.state = 'running'
     ORDER BY j.id";

fn fence_keys(attempts: &[AttemptKey<'_>]) -> String {
    json_rows(
        attempts
            .iter()
            .map(|a| serde_json::json!([a.job_id, a.attempt, a.worker])),
    )
}

impl SqliteStore {
    /// How SQLite runs the fence of a batch completing `jobs` (claimed by
    /// `worker`), one line per step of `EXPLAIN QUERY PLAN`. For checking
    /// that its cost follows the batch, not the jobs running beside it.
    pub async fn explain_fence(&self, worker: &str, jobs: &[ClaimedJob]) -> Result<Vec<String>> {
        let attempts: Vec<_> = jobs
            .iter()
            .map(|j| AttemptKey {
                job_id: j.job_id,
                attempt: j.attempt,
                worker,
            })
            .collect();
        let sql = format!("EXPLAIN QUERY PLAN {FENCE}");
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(fence_keys(&attempts))
            .fetch_all(&self.pool)
            .await?;
        Ok(plan.into_iter().map(|(.., detail)| detail).collect())
    }
}

/// Each step is one call on the writer connection: a call is a round trip
/// between the writer's thread and the committer's task.
impl CompletionTx for Completion<'_, '_> {
    async fn fence_and_insert(
        &mut self,
        attempts: &[AttemptKey<'_>],
        proposals: &[Proposal<'_>],
    ) -> Result<(Vec<Fenced>, Vec<StoredKey>)> {
        let fenced = self.fence(attempts).await?;
        let puts = complete::puts_of_fenced(&fenced, proposals);
        let inserted = self.artifacts_insert(&puts).await?;
        Ok((fenced, inserted))
    }

    async fn artifacts_read(&mut self, puts: &[CanonicalPut<'_>]) -> Result<Vec<StoredKey>> {
        let keys = json_rows(
            puts.iter()
                .map(|a| serde_json::json!([a.run_id, a.stage, a.output])),
        );
        Ok(sqlx::query_as(
            "SELECT a.run_id, a.stage, a.output, a.digest
             FROM json_each(?) AS k JOIN artifacts a
               ON a.run_id = k.value ->> 0 AND a.stage = k.value ->> 1
              AND a.output = k.value ->> 2",
        )
        .bind(keys)
        .fetch_all(&mut **self.0)
        .await?)
    }

    /// One call of statements sharing one parameter, a JSON document of
    /// every row (sqlx binds numbered parameters a statement skips to the
    /// wrong values, so each statement reads `?1` only); the jobs take
    /// consecutive values of the shared order, in the order given. The
    /// edges it satisfies go to the writer's scratch table `satisfied`
    /// first: each dependent loses as many from its pending count as it
    /// has edges there, and only edges that were unsatisfied are counted,
    /// so a completion applied twice changes nothing (the reconciler's
    /// recount repairs any drift). Returns the edges satisfied and the
    /// `(run, stage)` of each dependent that became ready.
    async fn record_success_and_release(
        &mut self,
        s: &Success<'_>,
    ) -> Result<(Vec<EdgeSatisfied>, Vec<(String, String)>)> {
        let outbox: Vec<_> = s
            .outbox
            .iter()
            .map(|o| serde_json::json!([o.dedup_key, o.run_id, o.stage, o.event, o.payload, o.now]))
            .collect();
        let attempts: Vec<_> = s
            .attempts
            .iter()
            .map(|a| {
                serde_json::json!([
                    a.job_id,
                    a.attempt,
                    a.now,
                    to_json(a.input_digests),
                    to_json(&a.proposals),
                    to_json(&a.canonical),
                    a.all_won,
                ])
            })
            .collect();
        let success = serde_json::json!({
            "outbox": outbox,
            "jobs": s.job_ids,
            "now": s.now,
            "attempts": attempts,
            "from": s.from,
        });
        let rows = sqlx::query(
            "INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
             SELECT o.value ->> 0, o.value ->> 1, o.value ->> 2, o.value ->> 3, o.value ->> 4,
                    o.value ->> 5
             FROM json_each(?1, '$.outbox') AS o WHERE true
             ON CONFLICT (dedup_key) DO NOTHING;

             UPDATE counters SET value = value + json_array_length(?1, '$.jobs')
             WHERE name = 'seq';

             UPDATE jobs SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,
                    last_error = NULL, updated_at = ?1 ->> '$.now',
                    succeeded_seq = (SELECT value FROM counters WHERE name = 'seq')
                                    - json_array_length(?1, '$.jobs') + 1 + k.key
             FROM json_each(?1, '$.jobs') AS k WHERE jobs.id = k.value;

             UPDATE attempts SET outcome = 'succeeded', finished_at = a.value ->> 2,
                    input_digests = a.value ->> 3, proposal_digests = a.value ->> 4,
                    canonical_digests = a.value ->> 5, proposal_won = a.value ->> 6
             FROM json_each(?1, '$.attempts') AS a
             WHERE attempts.job_id = a.value ->> 0 AND attempts.attempt = a.value ->> 1;

             DELETE FROM temp.satisfied;

             INSERT INTO temp.satisfied (edge, run_id, from_stage, to_stage)
             SELECT e.rowid, e.run_id, e.from_stage, e.to_stage
             FROM json_each(?1, '$.from') AS f
             CROSS JOIN edges e ON e.run_id = f.value ->> 0 AND e.from_stage = f.value ->> 1
             WHERE e.satisfied = 0;

             UPDATE edges SET satisfied = 1 WHERE rowid IN (SELECT edge FROM temp.satisfied);

             UPDATE jobs SET pending = pending - d.edges,
                    state = CASE WHEN state = 'blocked' AND pending - d.edges <= 0
                                 THEN 'ready' ELSE state END,
                    next_run_at = CASE WHEN state = 'blocked' AND pending - d.edges <= 0
                                       THEN ?1 ->> '$.now' ELSE next_run_at END,
                    updated_at = ?1 ->> '$.now'
             FROM (SELECT run_id, to_stage, COUNT(*) AS edges FROM temp.satisfied
                   GROUP BY run_id, to_stage) AS d
             WHERE jobs.run_id = d.run_id AND jobs.stage = d.to_stage
             RETURNING 'released' AS kind, run_id, stage, state;

             SELECT 'satisfied' AS kind, run_id, from_stage, to_stage FROM temp.satisfied",
        )
        .bind(success.to_string())
        .fetch_all(&mut **self.0)
        .await?;
        let (mut satisfied, mut ready) = (Vec::new(), Vec::new());
        for row in &rows {
            let kind: String = row.try_get("kind")?;
            match kind.as_str() {
                "satisfied" => satisfied.push(rows::edge_satisfied(row)?),
                "released" => {
                    if row.try_get::<String, _>("state")? == "ready" {
                        ready.push((row.try_get("run_id")?, row.try_get("stage")?));
                    }
                }
                other => return Err(rows::unknown_kind("edges", other)),
            }
        }
        Ok((satisfied, ready))
    }

    async fn runs_finish_if_done(&mut self, runs: &[&str], now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE runs SET state = 'succeeded', finished_at = ?1
             WHERE id IN (SELECT value FROM json_each(?2)) AND state = 'running'
               AND NOT EXISTS (SELECT 1 FROM jobs WHERE run_id = runs.id
                                 AND state IN ('blocked', 'ready', 'running', 'failed', 'dead', 'cancelled'))",
        )
        .bind(now)
        .bind(json_rows(runs.iter().map(|run| serde_json::json!(run))))
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }
}

impl Completion<'_, '_> {
    async fn fence(&mut self, attempts: &[AttemptKey<'_>]) -> Result<Vec<Fenced>> {
        let rows = sqlx::query(FENCE)
            .bind(fence_keys(attempts))
            .fetch_all(&mut **self.0)
            .await?;
        rows.iter().map(rows::fenced).collect()
    }

    /// Multi-row inserts: the bytes are bound as blobs, which a JSON array
    /// cannot carry.
    async fn artifacts_insert(&mut self, puts: &[CanonicalPut<'_>]) -> Result<Vec<StoredKey>> {
        if puts.is_empty() {
            return Ok(Vec::new());
        }
        let mut inserted = Vec::with_capacity(puts.len());
        for chunk in puts.chunks(ARTIFACT_ROWS_PER_INSERT) {
            let mut insert = QueryBuilder::<Sqlite>::new(
                "INSERT INTO artifacts (run_id, stage, output, media_type, bytes, digest, size,
                                        attempt, plugin_digest, created_at) ",
            );
            insert.push_values(chunk, |mut row, a| {
                row.push_bind(a.run_id)
                    .push_bind(a.stage)
                    .push_bind(a.output)
                    .push_bind(a.media_type)
                    .push_bind(a.bytes)
                    .push_bind(a.digest)
                    .push_bind(a.bytes.len() as i64)
                    .push_bind(a.attempt)
                    .push_bind(a.plugin_digest)
                    .push_bind(a.now);
            });
            insert.push(
                " ON CONFLICT (run_id, stage, output) DO NOTHING
                 RETURNING run_id, stage, output, digest",
            );
            inserted.extend(
                insert
                    .build_query_as::<StoredKey>()
                    .fetch_all(&mut **self.0)
                    .await?,
            );
        }
        Ok(inserted)
    }
}
