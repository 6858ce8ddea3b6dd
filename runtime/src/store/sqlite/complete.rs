//! The statements of a completion (`store::complete`), in SQLite's dialect.

use std::collections::BTreeMap;

use sqlx::{QueryBuilder, Row};

use super::*;
use crate::store::complete::{
    self, AttemptKey, CompletionTx, Fenced, Proposal, Released, StoredKey, Success,
};

/// Artifacts per multi-row insert: ten parameters each, far below SQLite's
/// limit on bound parameters.
const ARTIFACT_ROWS_PER_INSERT: usize = 256;

pub(super) async fn batch(store: &SqliteStore, b: &JobBatch) -> Result<JobBatchOutcome> {
    let mut writer = store.writer.lock().await;
    let mut tx = begin_write(&mut writer).await?;
    let (completed, ending) =
        complete::complete_many(&mut Completion(&mut tx), &b.completions).await?;
    let claimed = match &b.claim {
        Some(claim) => jobs::claim_tx(&mut tx, claim).await?,
        None => Vec::new(),
    };
    store.commit(tx).await?;
    if crate::crash::ack_lost() {
        return Err(StoreError::ack_lost());
    }
    Ok(JobBatchOutcome {
        completed,
        claimed,
        ending,
    })
}

pub(super) struct Completion<'t, 'c>(pub &'t mut Tx<'c>);

/// The job rows of a batch's attempts that still hold their lease, and
/// whether each says what the attempt's claim returned (the keys are a
/// JSON array of `[job, attempt, worker, run, stage, plugin, emits]`): the
/// jobs' columns come back only for a row that does not ([`FENCED_ROWS`]).
/// `CROSS JOIN` makes SQLite start from the keys: left to choose, it
/// walked every running job (by state) and read the whole key list again
/// for each.
const FENCE: &str = "SELECT j.id, j.attempt,
            j.run_id = k.value ->> 3 AND j.stage = k.value ->> 4
            AND j.plugin_digest = k.value ->> 5 AND j.emits = k.value ->> 6 AS as_claimed
     FROM jsonb_each(?) AS k CROSS JOIN jobs j ON j.id = k.value ->> 0
     WHERE j.attempt = k.value ->> 1 AND j.lease_owner = k.value ->> 2
       AND j.state = 'running'
     ORDER BY j.id";

/// The rows of fenced jobs that do not say what their claims returned.
const FENCED_ROWS: &str = "SELECT id, attempt, run_id, stage, plugin_digest, emits FROM jobs
     WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id";

fn fence_keys(attempts: &[AttemptKey<'_>]) -> String {
    let keys: Vec<_> = attempts
        .iter()
        .map(|a| {
            let job = a.job;
            let emits = to_json(&job.emits);
            (
                a.job_id,
                a.attempt,
                a.worker,
                &job.run_id,
                &job.stage,
                &job.plugin_digest,
                emits,
            )
        })
        .collect();
    to_json(&keys)
}

impl SqliteStore {
    /// How SQLite runs the fence of a batch completing `jobs` (claimed by
    /// `worker`), one line per step of `EXPLAIN QUERY PLAN`. For checking
    /// that its cost follows the batch, not the jobs running beside it.
    pub async fn explain_fence(&self, worker: &str, jobs: &[ClaimedJob]) -> Result<Vec<String>> {
        let claimed: Vec<ClaimedAs> = jobs.iter().map(Into::into).collect();
        let attempts: Vec<_> = jobs
            .iter()
            .zip(&claimed)
            .map(|(j, job)| AttemptKey {
                job_id: j.job_id,
                attempt: j.attempt,
                worker,
                job,
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

    async fn artifacts_read(&mut self, puts: &[ArtifactPut<'_>]) -> Result<Vec<StoredKey>> {
        let keys: Vec<_> = puts
            .iter()
            .map(|a| (a.run_id, a.stage, &a.artifact.name))
            .collect();
        let keys = to_json(&keys);
        Ok(sqlx::query_as(
            "SELECT a.run_id, a.stage, a.output, a.digest
             FROM jsonb_each(?) AS k JOIN artifacts a
               ON a.run_id = k.value ->> 0 AND a.stage = k.value ->> 1
              AND a.output = k.value ->> 2",
        )
        .bind(keys)
        .fetch_all(&mut **self.0)
        .await?)
    }

    /// One call of statements sharing one parameter, a JSON document of
    /// every row (sqlx binds numbered parameters a statement skips to the
    /// wrong values, so each statement reads `?1` only), parsed once into
    /// the writer's scratch table `batch_doc` (each statement reading the
    /// text parsed all of it again, and each row's JSON value once more:
    /// `jsonb_each` hands rows out already parsed); the jobs take
    /// consecutive values of the shared order, in the order given. The
    /// edges it satisfies go to the writer's scratch table `satisfied`
    /// first: each dependent loses as many from its pending count as it
    /// has edges there, and only edges that were unsatisfied are counted,
    /// so a completion applied twice changes nothing (the reconciler's
    /// recount repairs any drift). Returns the edges satisfied and the
    /// `(run, stage)` of each dependent that became ready.
    async fn record_success_and_release(&mut self, s: &Success<'_>) -> Result<Released> {
        let success = SuccessDoc::of(s);
        let rows = sqlx::query(concat!(
            "DELETE FROM temp.batch_doc;

             INSERT INTO temp.batch_doc (doc) VALUES (jsonb(?1));

             INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
             SELECT o.value ->> 0, o.value ->> 1, o.value ->> 2, o.value ->> 3, o.value ->> 4,
                    o.value ->> 5
             FROM temp.batch_doc d, jsonb_each(d.doc, '$.outbox') AS o WHERE true
             ON CONFLICT (dedup_key) DO NOTHING;

             UPDATE counters SET value = value + (SELECT doc ->> '$.count' FROM temp.batch_doc)
             WHERE name = 'seq';

             UPDATE runs SET unfinished = unfinished - (r.value ->> 1)
             FROM temp.batch_doc d, jsonb_each(d.doc, '$.runs') AS r
             WHERE runs.id = r.value ->> 0;

             UPDATE jobs SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,
                    last_error = NULL, updated_at = d.doc ->> '$.now',
                    succeeded_seq = (SELECT value FROM counters WHERE name = 'seq')
                                    - (d.doc ->> '$.count') + 1 + k.key
             FROM temp.batch_doc d, jsonb_each(d.doc, '$.jobs') AS k WHERE jobs.id = k.value;

             UPDATE attempts SET outcome = 'succeeded', finished_at = a.value ->> 2,
                    input_digests = a.value ->> 3, proposal_digests = a.value ->> 4,
                    canonical_digests = a.value ->> 5, proposal_won = a.value ->> 6
             FROM temp.batch_doc d, jsonb_each(d.doc, '$.attempts') AS a
             WHERE attempts.job_id = a.value ->> 0 AND attempts.attempt = a.value ->> 1;

             DELETE FROM temp.satisfied;

             INSERT INTO temp.satisfied (edge, run_id, from_stage, to_stage)
             SELECT e.rowid, e.run_id, e.from_stage, e.to_stage
             FROM temp.batch_doc d, jsonb_each(d.doc, '$.from') AS f
             CROSS JOIN edges e ON e.run_id = f.value ->> 0 AND e.from_stage = f.value ->> 1
             WHERE e.satisfied = 0;

             UPDATE edges SET satisfied = 1 WHERE rowid IN (SELECT edge FROM temp.satisfied);

             UPDATE jobs SET pending = pending - d.edges,
                    state = CASE WHEN state = 'blocked' AND pending - d.edges <= 0
                                 THEN ",
            released_state!(),
            " ELSE state END,
                    next_run_at = CASE WHEN state = 'blocked' AND pending - d.edges <= 0
                                       THEN d.now ELSE next_run_at END,
                    updated_at = d.now
             FROM (SELECT s.run_id, s.to_stage, COUNT(*) AS edges,
                          (SELECT doc ->> '$.now' FROM temp.batch_doc) AS now
                   FROM temp.satisfied s GROUP BY s.run_id, s.to_stage) AS d
             WHERE jobs.run_id = d.run_id AND jobs.stage = d.to_stage
             RETURNING 'released' AS kind, run_id, stage, state;

             SELECT 'satisfied' AS kind, run_id, from_stage, to_stage FROM temp.satisfied",
        ))
        .bind(to_json(&success))
        .fetch_all(&mut **self.0)
        .await?;
        let mut released = Released::default();
        for row in &rows {
            let kind: String = row.try_get("kind")?;
            match kind.as_str() {
                "satisfied" => released.satisfied.push(rows::edge_satisfied(row)?),
                "released" => {
                    let key = (row.try_get("run_id")?, row.try_get("stage")?);
                    match row.try_get::<String, _>("state")?.as_str() {
                        "ready" => released.ready.push(key),
                        "mapping" => released.mapping.push(key),
                        _ => {}
                    }
                }
                other => return Err(rows::unknown_kind("edges", other)),
            }
        }
        Ok(released)
    }

    /// A run's count of unsucceeded jobs says when to look; its jobs say
    /// whether it is done. A run finished gets its `run.succeeded`.
    async fn runs_finish_if_done(&mut self, runs: &[&str], now: i64) -> Result<()> {
        let runs = to_json(&runs);
        let finished = sqlx::query(
            "UPDATE runs SET state = 'succeeded', finished_at = ?1
             WHERE id IN (SELECT value FROM json_each(?2)) AND state = 'running'
               AND unfinished <= 0
               AND NOT EXISTS (SELECT 1 FROM jobs WHERE run_id = runs.id
                                 AND state != 'succeeded')",
        )
        .bind(now)
        .bind(&runs)
        .execute(&mut **self.0)
        .await?
        .rows_affected();
        if finished > 0 {
            runs::lifecycle_events(self.0, &runs, now).await?;
        }
        Ok(())
    }
}

/// The document `record_success_and_release` binds; each row is a JSON
/// array, in the order of its statements' `->>` indexes.
#[derive(serde::Serialize)]
struct SuccessDoc<'a> {
    outbox: Vec<(&'a str, &'a str, &'a str, &'a str, &'a str, i64)>,
    /// Each run's count of jobs this batch made succeed.
    runs: Vec<(&'a str, usize)>,
    count: usize,
    jobs: &'a [i64],
    now: i64,
    attempts: Vec<(i64, i64, i64, String, String, String, bool)>,
    from: &'a [(&'a str, &'a str)],
}

impl<'a> SuccessDoc<'a> {
    fn of(s: &'a Success<'a>) -> Self {
        let mut runs: BTreeMap<&str, usize> = BTreeMap::new();
        for (run, _) in &s.from {
            *runs.entry(run).or_default() += 1;
        }
        Self {
            outbox: s
                .outbox
                .iter()
                .map(|o| {
                    (
                        o.dedup_key.as_str(),
                        o.run_id,
                        o.stage,
                        o.event,
                        o.payload.as_str(),
                        o.now,
                    )
                })
                .collect(),
            runs: runs.into_iter().collect(),
            count: s.job_ids.len(),
            jobs: &s.job_ids,
            now: s.now,
            attempts: s
                .attempts
                .iter()
                .map(|a| {
                    (
                        a.job_id,
                        a.attempt,
                        a.now,
                        to_json(a.input_digests),
                        to_json(&a.proposals),
                        to_json(&a.canonical),
                        a.all_won,
                    )
                })
                .collect(),
            from: &s.from,
        }
    }
}

impl Completion<'_, '_> {
    /// Each live attempt's job as its claim returned it, unless its row
    /// says otherwise: then as the row says.
    async fn fence(&mut self, attempts: &[AttemptKey<'_>]) -> Result<Vec<Fenced>> {
        let live: Vec<(i64, i64, bool)> = sqlx::query_as(FENCE)
            .bind(fence_keys(attempts))
            .fetch_all(&mut **self.0)
            .await?;
        let mut fenced = Vec::with_capacity(live.len());
        let mut otherwise = Vec::new();
        for (job_id, attempt, as_claimed) in live {
            // The keys are sorted by job and attempt.
            let key = attempts
                .binary_search_by_key(&(job_id, attempt), |a| (a.job_id, a.attempt))
                .ok()
                .map(|at| &attempts[at]);
            match key {
                Some(key) if as_claimed => fenced.push(key.fenced_as_claimed()),
                _ => otherwise.push(job_id),
            }
        }
        if !otherwise.is_empty() {
            let rows = sqlx::query(FENCED_ROWS)
                .bind(to_json(&otherwise))
                .fetch_all(&mut **self.0)
                .await?;
            for row in &rows {
                fenced.push(rows::fenced(row)?);
            }
            fenced.sort_by_key(|f| f.job_id);
        }
        Ok(fenced)
    }

    /// Multi-row inserts: the bytes are bound as blobs, which a JSON array
    /// cannot carry.
    pub(super) async fn artifacts_insert(
        &mut self,
        puts: &[ArtifactPut<'_>],
    ) -> Result<Vec<StoredKey>> {
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
                    .push_bind(&a.artifact.name)
                    .push_bind(&a.artifact.media_type)
                    .push_bind(&a.artifact.bytes)
                    .push_bind(&a.artifact.digest)
                    .push_bind(a.artifact.bytes.len() as i64)
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
