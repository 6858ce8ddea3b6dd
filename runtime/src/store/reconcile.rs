//! Reconcile in bounded batches. A reconcile repairs what slipped past a
//! crash: leases that lapsed on a job's last attempt, edges of succeeded
//! stages left unsatisfied, dependency counts that drifted, runs whose
//! every job succeeded. It also rejects the approval gates whose timeout
//! passed, each in a transaction of its own. Each batch is a transaction of
//! its own, bounded in rows: at most [`RECONCILE_LEASES_PER_BATCH`] lapsed
//! leases, or the running runs of one page of [`RECONCILE_RUNS_PER_BATCH`]
//! (finished runs are never read). One transaction over the whole database
//! held SQLite's single writer, and every row lock it took on PostgreSQL,
//! for as long as the database was large, and scanned every edge ever
//! written.

use async_trait::async_trait;

use super::{Decision, ExpiredGate, GateDecide, GateOutcome, ReconcileReport, Result, Verdict};

/// Lapsed last-attempt leases ended per transaction.
pub const RECONCILE_LEASES_PER_BATCH: usize = 256;
/// Timed-out gates read per batch (each rejected in a transaction of its
/// own).
pub const RECONCILE_GATES_PER_BATCH: usize = 64;
/// Running runs repaired per transaction.
pub const RECONCILE_RUNS_PER_BATCH: usize = 64;

/// The reason a lapsed last-attempt lease kills its job.
pub(crate) const LAPSED_ON_LAST_ATTEMPT: &str =
    "lease expired on the final attempt (the worker died or hung)";

/// One batch of each kind, in one transaction each; both backends.
#[async_trait]
pub(crate) trait ReconcileBatches {
    /// Ends up to `limit` leases that lapsed on their job's last attempt,
    /// lowest job id first: the attempt `lease_expired`, the job dead, its
    /// run failed. Returns how many.
    async fn end_lapsed_leases(&self, now: i64, limit: usize) -> Result<u64>;
    /// Up to `limit` awaiting gates whose timeout passed by `now`.
    async fn expired_gates(&self, now: i64, limit: usize) -> Result<Vec<ExpiredGate>>;
    /// Decides a gate ([`super::Intake::gate_decide`]).
    async fn gate_time_out(&self, d: &GateDecide) -> Result<GateOutcome>;
    /// Up to `limit` ids of running runs after `after`, in id order.
    async fn running_runs(&self, after: &str, limit: usize) -> Result<Vec<String>>;
    /// Repairs edges, dependency counts and run states of these runs
    /// ([`repair_runs`]), in one transaction.
    async fn repair_runs(
        &self,
        runs: &[String],
        now: i64,
        report: &mut ReconcileReport,
    ) -> Result<()>;
}

/// The statements of repairing a batch of runs, inside one transaction.
pub(crate) trait RepairTx {
    /// Satisfies the unsatisfied edges whose predecessor succeeded.
    async fn edges_repair(&mut self, runs: &[String]) -> Result<u64>;
    /// Sets each blocked job's pending count to its unsatisfied edges,
    /// where they differ.
    async fn pending_recount(&mut self, runs: &[String], now: i64) -> Result<u64>;
    /// Makes the blocked jobs with nothing pending ready.
    async fn ready_release(&mut self, runs: &[String], now: i64) -> Result<u64>;
    /// Expands or joins the jobs of these runs that map over a list and
    /// were released (`store::map`).
    async fn maps_advance(&mut self, runs: &[String], now: i64) -> Result<()>;
    /// Finishes each running run whose every job succeeded.
    async fn runs_finish(&mut self, runs: &[String], now: i64) -> Result<u64>;
    /// Tells listening workers that jobs became ready, where the backend
    /// can (delivered on commit).
    async fn announce_ready(&mut self) -> Result<()>;
}

/// Repairs a batch of runs, in this order: edges, then the counts they
/// feed, then the jobs those release (maps expanded or joined), then the
/// runs that are done. Each
/// row count goes into `report`. The caller commits.
pub(crate) async fn repair_runs(
    tx: &mut impl RepairTx,
    runs: &[String],
    now: i64,
    report: &mut ReconcileReport,
) -> Result<()> {
    report.edges_repaired += tx.edges_repair(runs).await?;
    report.pending_repaired += tx.pending_recount(runs, now).await?;
    let ready = tx.ready_release(runs, now).await?;
    report.pending_repaired += ready;
    tx.maps_advance(runs, now).await?;
    report.runs_finished += tx.runs_finish(runs, now).await?;
    if ready > 0 {
        tx.announce_ready().await?;
    }
    Ok(())
}

/// Every batch until none is left.
pub(crate) async fn in_batches(store: &impl ReconcileBatches, now: i64) -> Result<ReconcileReport> {
    let mut report = ReconcileReport::default();
    loop {
        let ended = store
            .end_lapsed_leases(now, RECONCILE_LEASES_PER_BATCH)
            .await?;
        report.transactions += 1;
        report.dead_expired_leases += ended;
        if ended < RECONCILE_LEASES_PER_BATCH as u64 {
            break;
        }
    }
    loop {
        let expired = store.expired_gates(now, RECONCILE_GATES_PER_BATCH).await?;
        for gate in &expired {
            let decided = store.gate_time_out(&timed_out(gate, now)).await?;
            report.transactions += 1;
            if decided == GateOutcome::Decided {
                report.gates_timed_out += 1;
            }
        }
        if expired.len() < RECONCILE_GATES_PER_BATCH {
            break;
        }
    }
    let mut after = String::new();
    loop {
        let runs = store.running_runs(&after, RECONCILE_RUNS_PER_BATCH).await?;
        let Some(last) = runs.last() else {
            break;
        };
        after = last.clone();
        store.repair_runs(&runs, now, &mut report).await?;
        report.transactions += 1;
        if runs.len() < RECONCILE_RUNS_PER_BATCH {
            break;
        }
    }
    Ok(report)
}

/// The rejection a gate's timeout decides. An operator's decision racing
/// it finds the gate decided, or makes this one find it so.
fn timed_out(gate: &ExpiredGate, now: i64) -> GateDecide {
    GateDecide {
        run_id: gate.run_id.clone(),
        stage: gate.stage.clone(),
        decision: Decision {
            decision: Verdict::Rejected,
            by: "timeout".into(),
            at_ms: now,
            note: Some(format!("no decision within {} s", gate.timeout_ms / 1000)),
        },
    }
}
