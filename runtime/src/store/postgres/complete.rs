//! The statements of a completion (`store::complete`), in PostgreSQL's dialect.

use super::*;
use crate::store::complete::{
    self, AttemptKey, CompletionTx, EdgeSatisfied, Fenced, Proposal, StoredKey, Success,
};
use crate::store::rows::RowExt;

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

/// Each step is one statement: a batch waits for as few round trips to the
/// server as it can.
impl CompletionTx for Completion<'_> {
    /// The fence locks the job rows in id order (`MATERIALIZED` keeps that
    /// step whole, and the insert reads it); the insert stores each
    /// proposal of a fenced attempt under its job's run and stage. Rows of
    /// both come back in one result: a fenced job has an `id`, an inserted
    /// artifact an `output`.
    async fn fence_and_insert(
        &mut self,
        attempts: &[AttemptKey<'_>],
        proposals: &[Proposal<'_>],
    ) -> Result<(Vec<Fenced>, Vec<StoredKey>)> {
        let rows = sqlx::query(
            "WITH fenced AS MATERIALIZED (
                 SELECT j.id, j.attempt, j.run_id, j.stage, j.plugin_digest, j.emits
                 FROM jobs j
                 JOIN UNNEST($1::BIGINT[], $2::BIGINT[], $3::TEXT[]) AS k(id, attempt, worker)
                   ON j.id = k.id AND j.attempt = k.attempt AND j.lease_owner = k.worker
                 WHERE j.state = 'running'
                 ORDER BY j.id
                 FOR UPDATE OF j
             ), inserted AS (
                 INSERT INTO artifacts (run_id, stage, output, media_type, bytes, digest, size,
                                        attempt, plugin_digest, created_at)
                 SELECT f.run_id, f.stage, p.output, p.media_type, p.bytes, p.digest,
                        OCTET_LENGTH(p.bytes), p.attempt, f.plugin_digest, p.now
                 FROM UNNEST($4::BIGINT[], $5::BIGINT[], $6::TEXT[], $7::TEXT[], $8::BYTEA[],
                             $9::TEXT[], $10::BIGINT[])
                      AS p(job_id, attempt, output, media_type, bytes, digest, now)
                 JOIN fenced f ON f.id = p.job_id AND f.attempt = p.attempt
                 ON CONFLICT (run_id, stage, output) DO NOTHING
                 RETURNING run_id, stage, output, digest
             )
             SELECT id, attempt, run_id, stage, plugin_digest, emits,
                    NULL AS output, NULL AS digest
             FROM fenced
             UNION ALL
             SELECT NULL, NULL, run_id, stage, NULL, NULL, output, digest FROM inserted",
        )
        .bind(column(attempts, |a| a.job_id))
        .bind(column(attempts, |a| a.attempt))
        .bind(column(attempts, |a| a.worker))
        .bind(column(proposals, |p| p.job_id))
        .bind(column(proposals, |p| p.attempt))
        .bind(column(proposals, |p| p.output))
        .bind(column(proposals, |p| p.media_type))
        .bind(column(proposals, |p| p.bytes))
        .bind(column(proposals, |p| p.digest))
        .bind(column(proposals, |p| p.now))
        .fetch_all(&mut **self.0)
        .await?;
        let (mut fenced, mut inserted) = (Vec::new(), Vec::new());
        for row in &rows {
            match row.opt_text("output")? {
                None => fenced.push(rows::fenced(row)?),
                Some(output) => inserted.push((
                    row.text("run_id")?,
                    row.text("stage")?,
                    output,
                    row.text("digest")?,
                )),
            }
        }
        Ok((fenced, inserted))
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

    /// One statement: data-modifying `WITH` clauses write the outbox rows,
    /// the jobs (taking values of the shared order in the order given, as
    /// on SQLite), the attempts and the edges; the dependents the satisfied
    /// edges point to are locked in `(run, stage)` order (`MATERIALIZED`
    /// keeps that lock step whole), and the decrement then reads each
    /// locked row's latest version, so two predecessors finishing at once
    /// cannot both miss each other (a recount could, under READ COMMITTED).
    /// A dependent is never one of the jobs succeeding: it is blocked until
    /// they have. Rows of both come back in one result: a dependent has a
    /// `state`.
    async fn record_success_and_release(
        &mut self,
        s: &Success<'_>,
    ) -> Result<(Vec<EdgeSatisfied>, Vec<(String, String)>)> {
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
             ), satisfied AS (
                 UPDATE edges e SET satisfied = 1
                 FROM UNNEST($16::TEXT[], $17::TEXT[]) AS f(run_id, stage)
                 WHERE e.run_id = f.run_id AND e.from_stage = f.stage AND e.satisfied = 0
                 RETURNING e.run_id, e.from_stage, e.to_stage
             ), locked AS MATERIALIZED (
                 SELECT j.id, d.edges FROM jobs j
                 JOIN (SELECT run_id, to_stage, COUNT(*) AS edges FROM satisfied
                       GROUP BY run_id, to_stage) AS d
                   ON j.run_id = d.run_id AND j.stage = d.to_stage
                 ORDER BY j.run_id, j.stage
                 FOR NO KEY UPDATE OF j
             ), released AS (
                 UPDATE jobs j SET pending = j.pending - l.edges,
                        state = CASE WHEN j.state = 'blocked' AND j.pending - l.edges <= 0
                                     THEN 'ready' ELSE j.state END,
                        next_run_at = CASE WHEN j.state = 'blocked' AND j.pending - l.edges <= 0
                                           THEN $7 ELSE j.next_run_at END,
                        updated_at = $7
                 FROM locked l WHERE j.id = l.id
                 RETURNING j.run_id, j.stage, j.state
             )
             SELECT run_id, from_stage, to_stage, NULL AS state FROM satisfied
             UNION ALL
             SELECT run_id, NULL, stage, state FROM released",
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
        let (mut satisfied, mut ready) = (Vec::new(), Vec::new());
        for row in &rows {
            match row.opt_text("state")?.as_deref() {
                None => satisfied.push(rows::edge_satisfied(row)?),
                Some("ready") => ready.push((row.text("run_id")?, row.text("to_stage")?)),
                Some(_) => {}
            }
        }
        Ok((satisfied, ready))
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
