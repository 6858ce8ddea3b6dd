//! The steps of a completion (`store::complete`) on PostgreSQL, each a
//! call of a function of migration 0006, and a whole batch with the claim
//! after it in one call of `ratchet_complete_batch`, which runs the same
//! functions (ADR 0010).

use std::sync::atomic::Ordering;

use super::*;
use crate::store::complete::{
    self, AttemptKey, BatchOrder, CompletionTx, Fenced, Proposal, Released, StoredKey, Success,
};
use crate::store::rows::RowExt;

/// The SQLSTATE `ratchet_complete_batch` raises when the batch is not the
/// common case (an attempt fenced out, a proposal that lost): nothing it
/// wrote stays, and the batch runs statement by statement instead.
const NOT_IN_ONE_CALL: &str = "RT001";

pub(super) async fn batch(store: &PostgresStore, b: &JobBatch) -> Result<JobBatchOutcome> {
    // A claim under caps takes its plugins' locks and counts: its own
    // statements, after the batch's.
    let capped = b.claim.as_ref().is_some_and(|c| !c.caps.is_empty());
    let outcome = if b.completions.is_empty() || capped {
        in_steps(store, b).await?
    } else {
        match in_one_call(store, b).await {
            Err(StoreError::Database(sqlx::Error::Database(e)))
                if e.code().as_deref() == Some(NOT_IN_ONE_CALL) =>
            {
                tracing::debug!("a batch is written step by step: {}", e.message());
                in_steps(store, b).await?
            }
            other => other?,
        }
    };
    if crate::crash::ack_lost() {
        return Err(StoreError::ack_lost());
    }
    // After the commit, not in it: a transaction that notifies holds a
    // lock shared by every notifier until its commit is flushed, which
    // would put the parallel committers' flushes in a row. Best-effort: the
    // batch committed, and an error here must not report it as failed
    // (it would be re-sent, fenced out as lease-lost, and the jobs it
    // claimed orphaned); idle workers and waiting clients poll as a safety
    // net.
    let ready = complete::released_unclaimed(b, &outcome);
    if (ready || !outcome.ending.is_empty())
        && let Err(e) = announce(&store.pool, ready, &outcome.ending).await
    {
        tracing::warn!(
            "announcing released jobs and ended runs failed (workers and waiters will find them by polling): {e}"
        );
    }
    Ok(outcome)
}

/// The batch as one statement-by-statement transaction.
async fn in_steps(store: &PostgresStore, b: &JobBatch) -> Result<JobBatchOutcome> {
    if !b.completions.is_empty() {
        store.stepped.fetch_add(1, Ordering::Relaxed);
    }
    let mut tx = store.begin_write().await?;
    let (completed, ending) =
        complete::complete_many(&mut Completion(&mut tx), &b.completions).await?;
    let claimed = match &b.claim {
        Some(claim) => jobs::claim_tx(&mut tx, claim).await?,
        None => Vec::new(),
    };
    tx.commit().await?;
    Ok(JobBatchOutcome {
        completed,
        claimed,
        ending,
    })
}

pub(super) struct Completion<'t>(pub &'t mut Tx);

/// The fence and the insert (`ratchet_fence_and_insert`, migration 0006):
/// `$1`–`$3` the attempts, `$4`–`$10` the proposals.
const FENCE_AND_INSERT: &str =
    "SELECT * FROM ratchet_fence_and_insert($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

fn bind_fence_and_insert<'q>(
    query: PgQuery<'q>,
    attempts: &'q [AttemptKey<'_>],
    proposals: &'q [Proposal<'_>],
) -> PgQuery<'q> {
    query
        .bind(column(attempts, |a| a.job_id))
        .bind(column(attempts, |a| a.attempt))
        .bind(column(attempts, |a| a.worker))
        .bind(column(proposals, |p| p.job_id))
        .bind(column(proposals, |p| p.attempt))
        .bind(column(proposals, |p| p.artifact.name.as_str()))
        .bind(column(proposals, |p| p.artifact.media_type.as_str()))
        .bind(column(proposals, |p| p.artifact.bytes.as_slice()))
        .bind(column(proposals, |p| p.artifact.digest.as_str()))
        .bind(column(proposals, |p| p.now))
}

/// The success and the release (`ratchet_success_and_release`, migration
/// 0006): `$1`–`$6` the outbox rows, `$7` now, `$8` the jobs, `$9`–`$15`
/// the attempts, `$16`–`$17` the `(run, stage)` the edges leave.
const SUCCESS_AND_RELEASE: &str = "SELECT * FROM ratchet_success_and_release(
     $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)";

fn bind_success<'q>(query: PgQuery<'q>, s: &'q Success<'_>) -> PgQuery<'q> {
    let (outbox, attempts) = (&s.outbox, &s.attempts);
    query
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
}

/// Finishes each run of `$2` that has no job left to do, at `$1`
/// (`ratchet_finish_runs`, migration 0006), its row locked first.
const FINISH_RUNS: &str = "SELECT 1 FROM ratchet_finish_runs($1, $2)";

/// `ratchet_complete_batch` (migration 0006): the fence and insert's
/// parameters, each attempt's job as its claim returned it, the success and
/// release's parameters, the claim statement and its parameters.
const COMPLETE_BATCH: &str = "SELECT * FROM ratchet_complete_batch(
     $1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
     $11, $12, $13, $14,
     $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31,
     $32, $33, $34, $35, $36, $37)";

/// The whole batch and the claim after it in one call, as `complete_many`
/// and `claim_tx` would write it when every attempt still holds its lease
/// on the job its claim returned and every proposal is the first stored
/// under its key. The function checks both before anything it writes can
/// stay, and raises [`NOT_IN_ONE_CALL`] otherwise.
async fn in_one_call(store: &PostgresStore, b: &JobBatch) -> Result<JobBatchOutcome> {
    let batch = &b.completions;
    let plan = BatchOrder::of(batch);
    let live = plan.as_claimed();
    let outputs_of = complete::proposed_as_won(batch, &live);
    let success = complete::success_of(batch, &live, &outputs_of);
    let query = bind_fence_and_insert(sqlx::query(COMPLETE_BATCH), &plan.keys, &plan.proposals)
        .bind(column(&live, |(_, job)| job.run_id.as_str()))
        .bind(column(&live, |(_, job)| job.stage.as_str()))
        .bind(column(&live, |(_, job)| job.plugin_digest.as_str()))
        .bind(column(&live, |(_, job)| to_json(&job.emits)));
    let query = bind_success(query, &success).bind(jobs::CLAIM);
    let query = match &b.claim {
        Some(claim) => jobs::bind_claim(query, claim),
        None => query
            .bind(None::<i64>)
            .bind(None::<i64>)
            .bind(None::<i64>)
            .bind(None::<&str>)
            .bind(None::<i64>),
    };
    // The steps that `after_persist` and `after_outbox_insert` sit between
    // all run inside this one call: here the two are one moment, before the
    // call commits. A process that stops here leaves nothing of the batch,
    // as one that stops between the steps does (its transaction rolls
    // back). A batch that falls back to steps passes them again there.
    crate::crash::point_per_attempt("after_persist", live.len());
    crate::crash::point("after_outbox_insert");
    let rows = query.fetch_all(&store.pool).await?;
    let lease = b
        .claim
        .as_ref()
        .map_or((0, 0), |c| (c.now, c.now + c.lease_ms));
    let (mut satisfied, mut ready) = (Vec::new(), Vec::new());
    let mut claimed = rows::ClaimedRows::default();
    for row in &rows {
        match row.text("kind")?.as_str() {
            "satisfied" => satisfied.push(rows::edge_satisfied(row)?),
            "ready" => ready.push((row.text("run_id")?, row.text("to_stage")?)),
            kind @ ("claimed" | "taken_over") => {
                let mut job = rows::claimed_job(row, row.int("id")?, lease)?;
                job.taken_over = kind == "taken_over";
                claimed.job(job.job_id, job);
            }
            "input" => claimed.input(row.int("id")?, rows::loaded_input(row)?)?,
            kind => return Err(rows::unknown_kind("ratchet_complete_batch", kind)),
        }
    }
    let (released_by, runs) = complete::releases_of(&live, &satisfied, &ready)?;
    // The runs the function tried to finish (it computes the same set).
    let ending = runs.iter().map(|run| run.to_string()).collect();
    let completed = complete::outcomes(batch.len(), &live, outputs_of, released_by);
    Ok(JobBatchOutcome {
        completed,
        claimed: claimed.into_jobs(),
        ending,
    })
}

/// Each step is one round trip.
impl CompletionTx for Completion<'_> {
    async fn fence_and_insert(
        &mut self,
        attempts: &[AttemptKey<'_>],
        proposals: &[Proposal<'_>],
    ) -> Result<(Vec<Fenced>, Vec<StoredKey>)> {
        let rows = bind_fence_and_insert(sqlx::query(FENCE_AND_INSERT), attempts, proposals)
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

    async fn artifacts_read(&mut self, puts: &[ArtifactPut<'_>]) -> Result<Vec<StoredKey>> {
        Ok(sqlx::query_as(
            "SELECT a.run_id, a.stage, a.output, a.digest
             FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[]) AS k(run_id, stage, output)
             JOIN artifacts a
               ON a.run_id = k.run_id AND a.stage = k.stage AND a.output = k.output",
        )
        .bind(column(puts, |a| a.run_id))
        .bind(column(puts, |a| a.stage))
        .bind(column(puts, |a| a.artifact.name.as_str()))
        .fetch_all(&mut **self.0)
        .await?)
    }

    async fn record_success_and_release(&mut self, s: &Success<'_>) -> Result<Released> {
        let rows = bind_success(sqlx::query(SUCCESS_AND_RELEASE), s)
            .fetch_all(&mut **self.0)
            .await?;
        let mut released = Released::default();
        for row in &rows {
            let key = || Ok::<_, StoreError>((row.text("run_id")?, row.text("to_stage")?));
            match row.opt_text("state")?.as_deref() {
                None => released.satisfied.push(rows::edge_satisfied(row)?),
                Some("ready") => released.ready.push(key()?),
                Some("mapping") => released.mapping.push(key()?),
                Some(_) => {}
            }
        }
        Ok(released)
    }

    async fn runs_finish_if_done(&mut self, runs: &[&str], now: i64) -> Result<()> {
        sqlx::query(FINISH_RUNS)
            .bind(now)
            .bind(runs)
            .execute(&mut **self.0)
            .await?;
        Ok(())
    }
}
