//! The statements of a completion (`store::complete`), in PostgreSQL's dialect.

use super::*;
use crate::store::complete::{
    self, AttemptKey, CompletionTx, DependentRelease, EdgeSatisfied, Fenced, StoredKey, Success,
};

pub(super) async fn batch(store: &PostgresStore, b: &JobBatch) -> Result<JobBatchOutcome> {
    let mut tx = store.begin_write().await?;
    let completed = complete::complete_many(&mut Completion(&mut tx), &b.completions).await?;
    let claimed = match &b.claim {
        Some(claim) => jobs::claim_tx(&mut tx, claim).await?,
        None => Vec::new(),
    };
    tx.commit().await?;
    let outcome = JobBatchOutcome { completed, claimed };
    // After the commit, not in it: a transaction that notifies holds a
    // lock shared by every notifier until its commit is flushed, which
    // would put the parallel committers' flushes in a row.
    if complete::released_unclaimed(b, &outcome) {
        notify_ready(&store.pool).await?;
    }
    Ok(outcome)
}

struct Completion<'t>(&'t mut Tx);

/// One column of a set of rows, bound as one array parameter.
fn column<'r, T, U>(rows: &'r [T], f: impl Fn(&'r T) -> U) -> Vec<U> {
    rows.iter().map(f).collect()
}

impl CompletionTx for Completion<'_> {
    async fn fence(&mut self, attempts: &[AttemptKey<'_>]) -> Result<Vec<Fenced>> {
        let rows = sqlx::query(
            "SELECT j.id, j.run_id, j.stage, j.plugin_digest, j.emits
             FROM jobs j
             JOIN UNNEST($1::BIGINT[], $2::BIGINT[], $3::TEXT[]) AS k(id, attempt, worker)
               ON j.id = k.id AND j.attempt = k.attempt AND j.lease_owner = k.worker
             WHERE j.state = 'running'
             ORDER BY j.id
             FOR UPDATE OF j",
        )
        .bind(column(attempts, |a| a.job_id))
        .bind(column(attempts, |a| a.attempt))
        .bind(column(attempts, |a| a.worker))
        .fetch_all(&mut **self.0)
        .await?;
        rows.iter().map(rows::fenced).collect()
    }

    async fn artifacts_insert(&mut self, puts: &[CanonicalPut<'_>]) -> Result<Vec<StoredKey>> {
        Ok(sqlx::query_as(
            "INSERT INTO artifacts (run_id, stage, output, media_type, bytes, digest, size,
                                    attempt, plugin_digest, created_at)
             SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BYTEA[],
                                  $6::TEXT[], $7::BIGINT[], $8::BIGINT[], $9::TEXT[],
                                  $10::BIGINT[])
             ON CONFLICT (run_id, stage, output) DO NOTHING
             RETURNING run_id, stage, output, digest",
        )
        .bind(column(puts, |a| a.run_id))
        .bind(column(puts, |a| a.stage))
        .bind(column(puts, |a| a.output))
        .bind(column(puts, |a| a.media_type))
        .bind(column(puts, |a| a.bytes))
        .bind(column(puts, |a| a.digest))
        .bind(column(puts, |a| a.bytes.len() as i64))
        .bind(column(puts, |a| a.attempt))
        .bind(column(puts, |a| a.plugin_digest))
        .bind(column(puts, |a| a.now))
        .fetch_all(&mut **self.0)
        .await?)
    }

    async fn artifacts_read(&mut self, puts: &[CanonicalPut<'_>]) -> Result<Vec<StoredKey>> {
        Ok(sqlx::query_as(
            "SELECT a.run_id, a.stage, a.output, a.digest
             FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[]) AS k(run_id, stage, output)
             JOIN artifacts a
               ON a.run_id = k.run_id AND a.stage = k.stage AND a.output = k.output",
        )
        .bind(column(puts, |a| a.run_id))
        .bind(column(puts, |a| a.stage))
        .bind(column(puts, |a| a.output))
        .fetch_all(&mut **self.0)
        .await?)
    }

    /// One statement: the outbox rows, the jobs and the attempts are
    /// written by data-modifying `WITH` clauses, and the edges by the main
    /// statement, which returns them. The jobs take values of the shared
    /// order in the order given, as on SQLite.
    async fn record_success(&mut self, s: &Success<'_>) -> Result<Vec<EdgeSatisfied>> {
        let (outbox, attempts) = (&s.outbox, &s.attempts);
        let rows = sqlx::query(
            "WITH outbox_rows AS (
                 INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
                 SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[],
                                      $5::TEXT[], $6::BIGINT[])
                 ON CONFLICT (dedup_key) DO NOTHING
             ), succeeded AS (
                 UPDATE jobs SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,
                        last_error = NULL, succeeded_seq = s.seq, updated_at = $7
                 FROM (SELECT id, nextval('ratchet_seq') AS seq
                       FROM UNNEST($8::BIGINT[]) WITH ORDINALITY AS x(id, n) ORDER BY n) AS s
                 WHERE jobs.id = s.id
             ), attempted AS (
                 UPDATE attempts a SET outcome = 'succeeded', finished_at = x.now,
                        input_digests = x.inputs, proposal_digests = x.proposals,
                        canonical_digests = x.canonical, proposal_won = x.won
                 FROM UNNEST($9::BIGINT[], $10::BIGINT[], $11::BIGINT[], $12::TEXT[], $13::TEXT[],
                             $14::TEXT[], $15::BIGINT[])
                      AS x(job_id, attempt, now, inputs, proposals, canonical, won)
                 WHERE a.job_id = x.job_id AND a.attempt = x.attempt
             )
             UPDATE edges e SET satisfied = 1
             FROM UNNEST($16::TEXT[], $17::TEXT[]) AS f(run_id, stage)
             WHERE e.run_id = f.run_id AND e.from_stage = f.stage AND e.satisfied = 0
             RETURNING e.run_id, e.from_stage, e.to_stage",
        )
        .bind(column(outbox, |o| o.dedup_key.as_str()))
        .bind(column(outbox, |o| o.run_id))
        .bind(column(outbox, |o| o.stage))
        .bind(column(outbox, |o| o.event))
        .bind(column(outbox, |o| o.payload.as_str()))
        .bind(column(outbox, |o| o.now))
        .bind(s.now)
        .bind(&s.job_ids)
        .bind(column(attempts, |a| a.job_id))
        .bind(column(attempts, |a| a.attempt))
        .bind(column(attempts, |a| a.now))
        .bind(column(attempts, |a| to_json(a.input_digests)))
        .bind(column(attempts, |a| to_json(&a.proposals)))
        .bind(column(attempts, |a| to_json(&a.canonical)))
        .bind(column(attempts, |a| i64::from(a.all_won)))
        .bind(column(&s.from, |f| f.0))
        .bind(column(&s.from, |f| f.1))
        .fetch_all(&mut **self.0)
        .await?;
        rows.iter().map(rows::edge_satisfied).collect()
    }

    /// The rows are locked in `(run, stage)` order first (`MATERIALIZED`
    /// keeps that lock step whole); the decrement then reads each locked
    /// row's latest version, so two predecessors finishing at once cannot
    /// both miss each other (a recount in one statement could, under READ
    /// COMMITTED).
    async fn dependents_release(
        &mut self,
        dependents: &[DependentRelease<'_>],
        now: i64,
    ) -> Result<Vec<bool>> {
        let ready: Vec<(String, String)> = sqlx::query_as(
            "WITH locked AS MATERIALIZED (
                 SELECT j.id, d.edges FROM jobs j
                 JOIN UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[]) AS d(run_id, stage, edges)
                   ON j.run_id = d.run_id AND j.stage = d.stage
                 ORDER BY j.run_id, j.stage
                 FOR NO KEY UPDATE OF j
             )
             UPDATE jobs j SET pending = j.pending - l.edges,
                    state = CASE WHEN j.state = 'blocked' AND j.pending - l.edges <= 0
                                 THEN 'ready' ELSE j.state END,
                    next_run_at = CASE WHEN j.state = 'blocked' AND j.pending - l.edges <= 0
                                       THEN $4 ELSE j.next_run_at END,
                    updated_at = $4
             FROM locked l WHERE j.id = l.id
             RETURNING j.run_id, j.stage, j.state",
        )
        .bind(column(dependents, |d| d.run_id))
        .bind(column(dependents, |d| d.stage))
        .bind(column(dependents, |d| d.edges))
        .bind(now)
        .fetch_all(&mut **self.0)
        .await?
        .into_iter()
        .filter_map(|(run, stage, state): (String, String, String)| {
            (state == "ready").then_some((run, stage))
        })
        .collect();
        Ok(complete::ready_in_order(dependents, &ready))
    }

    /// Locks the run rows first: the last two completions of a run then see
    /// each other's commits, and one of them finishes the run.
    async fn runs_finish_if_done(&mut self, runs: &[&str], now: i64) -> Result<()> {
        sqlx::query("SELECT id FROM runs WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE")
            .bind(runs)
            .execute(&mut **self.0)
            .await?;
        sqlx::query(
            "UPDATE runs SET state = 'succeeded', finished_at = $1
             WHERE id = ANY($2) AND state = 'running'
               AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.run_id = runs.id
                                 AND state IN ('blocked', 'ready', 'running', 'failed', 'dead', 'cancelled'))",
        )
        .bind(now)
        .bind(runs)
        .execute(&mut **self.0)
        .await?;
        Ok(())
    }
}
