//! The worker loop: a producer claims due jobs for the free slots in one
//! transaction; a busy slot runs its attempt and then the successor its
//! completion claimed in the same transaction. Woken by releases
//! (in-process or, on Postgres, `NOTIFY`) or a slow poll; reconciles on
//! start and periodically, and renews the leases of its running attempts
//! every third of a lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::scheduler::{AttemptOutcome, Scheduler};
use crate::store::{ClaimedJob, JobState, JobsVacuum, Queue, StoreError};

/// How long a worker waits before asking for a vacuum again after one
/// failed or was not permitted.
const VACUUM_BACKOFF: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub concurrency: usize,
    /// Most jobs claimed in one transaction (never more than free slots).
    pub claim_batch: usize,
    /// Return once no job is ready or running anywhere in the store.
    pub until_idle: bool,
    /// Longest wait between claims when nothing wakes the worker.
    pub poll: Duration,
    pub reconcile_every: Duration,
    /// How often to ask the store whether its job queue needs a vacuum
    /// ([`crate::store::Queue::jobs_vacuum`]).
    pub vacuum_every: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            concurrency: 4,
            claim_batch: 64,
            until_idle: false,
            poll: Duration::from_millis(200),
            reconcile_every: Duration::from_secs(10),
            vacuum_every: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Default)]
pub struct WorkerStats {
    pub attempts: AtomicU64,
    pub succeeded: AtomicU64,
    pub retried: AtomicU64,
    pub dead: AtomicU64,
    pub lease_lost: AtomicU64,
}

impl WorkerStats {
    pub fn summary(&self) -> String {
        format!(
            "{} attempts: {} succeeded, {} to retry, {} dead, {} fenced out",
            self.attempts.load(Ordering::Relaxed),
            self.succeeded.load(Ordering::Relaxed),
            self.retried.load(Ordering::Relaxed),
            self.dead.load(Ordering::Relaxed),
            self.lease_lost.load(Ordering::Relaxed),
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("a worker task panicked: {0}; stopping the worker (its attempts will be retried)")]
    Panicked(String),
}

/// Runs up to `concurrency` attempts at a time of `sched`, which drives
/// `queue` (the same store), until `shutdown` turns true
/// (or, with `until_idle`, until there is nothing left to do). In-flight
/// attempts finish first.
pub async fn run(
    queue: Arc<dyn Queue>,
    sched: Arc<Scheduler>,
    clock: Arc<dyn Clock>,
    opts: WorkerOptions,
    shutdown: watch::Receiver<bool>,
) -> Result<Arc<WorkerStats>, WorkerError> {
    let stats = Arc::new(WorkerStats::default());
    let wake = Arc::new(Notify::new());
    let _listening = queue.listen_ready(wake.clone());
    let report = queue.reconcile(clock.now_ms()).await?;
    if report.changed() {
        tracing::info!(?report, "reconciled on start");
    }
    let reconciler = (!opts.until_idle).then(|| {
        let (queue, clock, mut shutdown, every) = (
            queue.clone(),
            clock.clone(),
            shutdown.clone(),
            opts.reconcile_every,
        );
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                match queue.reconcile(clock.now_ms()).await {
                    Ok(r) if r.changed() => tracing::info!(report = ?r, "reconciled"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("reconcile failed: {e}"),
                }
            }
        })
    });
    // Runs until the producer is done, not until a shutdown is asked for:
    // the attempts in flight finish first, and keep their leases meanwhile.
    let renewer = {
        let sched = sched.clone();
        let every = Duration::from_millis((sched.config().lease_ms / 3).max(1) as u64);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match sched.renew_leases().await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(renewed = n, "leases renewed"),
                    Err(e) => tracing::warn!("renewing leases failed: {e}"),
                }
            }
        })
    };
    // In both modes: a large run's burn-down is where the dead row
    // versions pile up (ADR 0019).
    let vacuum = {
        let (queue, every) = (queue.clone(), opts.vacuum_every);
        tokio::spawn(async move {
            let mut refusal_told = false;
            loop {
                tokio::time::sleep(every).await;
                match queue.jobs_vacuum().await {
                    Ok(JobsVacuum::Vacuumed) => tracing::debug!("vacuumed the job queue"),
                    Ok(JobsVacuum::NotDue) => {}
                    // Told once; asked again a minute later (a grant may come).
                    Ok(JobsVacuum::NotPermitted(why)) => {
                        if !std::mem::replace(&mut refusal_told, true) {
                            tracing::warn!("not vacuuming the job queue: {why}");
                        }
                        tokio::time::sleep(VACUUM_BACKOFF).await;
                    }
                    Err(e) => {
                        tracing::warn!("cannot vacuum the job queue (retrying in a minute): {e}");
                        tokio::time::sleep(VACUUM_BACKOFF).await;
                    }
                }
            }
        })
    };
    let producer = Producer {
        queue,
        sched,
        clock,
        opts,
        stats: stats.clone(),
        wake,
        shutdown,
        shutdown_open: true,
        attempts: JoinSet::new(),
        store_errors: 0,
    };
    let produced = producer.run().await;
    renewer.abort();
    vacuum.abort();
    if let Some(reconciler) = reconciler {
        reconciler.abort();
    }
    produced.map(|()| stats)
}

/// Claims as many due jobs as there are free slots, in one transaction, and
/// runs each claimed attempt in a task of its own.
struct Producer {
    queue: Arc<dyn Queue>,
    sched: Arc<Scheduler>,
    clock: Arc<dyn Clock>,
    opts: WorkerOptions,
    stats: Arc<WorkerStats>,
    wake: Arc<Notify>,
    shutdown: watch::Receiver<bool>,
    /// One task per busy slot.
    attempts: JoinSet<Result<(), StoreError>>,
    shutdown_open: bool,
    /// Transient store errors in a row, for the backoff.
    store_errors: u32,
}

/// What the producer does next.
enum Next {
    /// Claim now: something may be due.
    Claim,
    /// Wait for a wake-up, a finished attempt or this long.
    Wait(Duration),
}

impl Producer {
    async fn run(mut self) -> Result<(), WorkerError> {
        let slots = self.opts.concurrency.max(1);
        let mut next = Next::Claim;
        while !*self.shutdown.borrow() {
            let wake = self.wake.clone();
            let notified = wake.notified();
            if let Next::Claim = next {
                // Attempts that finished together free their slots together,
                // and their successors are claimed in one transaction.
                while let Some(joined) = self.attempts.try_join_next() {
                    self.finished(joined)?;
                }
                let free = slots - self.attempts.len();
                next = if free == 0 {
                    Next::Wait(self.opts.poll)
                } else {
                    self.claim(free).await?
                };
                if let Next::Claim = next {
                    continue;
                }
            }
            let Next::Wait(wait) = next else { continue };
            next = tokio::select! {
                _ = notified => Next::Claim,
                _ = tokio::time::sleep(wait) => Next::Claim,
                changed = self.shutdown.changed(), if self.shutdown_open => {
                    // A dropped sender can no longer ask for a shutdown.
                    self.shutdown_open = changed.is_ok();
                    Next::Wait(wait)
                }
                Some(joined) = self.attempts.join_next(), if !self.attempts.is_empty() => {
                    self.finished(joined)?
                }
            };
        }
        // Shutting down: claim nothing more, let what runs finish.
        while let Some(joined) = self.attempts.join_next().await {
            self.finished(joined)?;
        }
        Ok(())
    }

    /// Claims up to `free` jobs and starts them; what to do next.
    async fn claim(&mut self, free: usize) -> Result<Next, WorkerError> {
        let want = free.min(self.opts.claim_batch.max(1));
        let claimed = match self.sched.claim_many(want).await {
            Ok(claimed) => claimed,
            Err(e) => return self.store_error(e).map(Next::Wait),
        };
        self.store_errors = 0;
        let got = claimed.len();
        for job in claimed {
            let slot = Slot {
                sched: self.sched.clone(),
                stats: self.stats.clone(),
                wake: self.wake.clone(),
                shutdown: self.shutdown.clone(),
            };
            self.attempts.spawn(slot.run(job));
        }
        if got == want {
            return Ok(Next::Claim);
        }
        if got > 0 || !self.attempts.is_empty() {
            // Drained for now: what runs will wake us, or a release will.
            return Ok(Next::Wait(self.idle_wait().await?));
        }
        if self.opts.until_idle && self.all_done().await? {
            self.shutdown_now();
            return Ok(Next::Wait(Duration::ZERO));
        }
        Ok(Next::Wait(self.idle_wait().await?))
    }

    /// A slot fell idle; what to do next.
    fn finished(
        &mut self,
        joined: Result<Result<(), StoreError>, tokio::task::JoinError>,
    ) -> Result<Next, WorkerError> {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return self.store_error(e).map(Next::Wait),
            Err(e) if e.is_panic() => {
                self.attempts.abort_all();
                return Err(WorkerError::Panicked(panic_message(e.into_panic())));
            }
            Err(_) => {}
        }
        self.store_errors = 0;
        Ok(Next::Claim)
    }

    /// A restarting database or a dropped connection: back off and try
    /// again; the pool reconnects. Anything else stops the worker.
    fn store_error(&mut self, e: StoreError) -> Result<Duration, WorkerError> {
        if !e.is_transient() {
            self.attempts.abort_all();
            return Err(e.into());
        }
        self.store_errors = self.store_errors.saturating_add(1);
        let backoff = Duration::from_millis(100u64 << self.store_errors.min(6));
        tracing::warn!("store unavailable, retrying in {backoff:?}: {e}");
        Ok(backoff)
    }

    /// Nothing ready or running anywhere, and nothing left to repair.
    async fn all_done(&self) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let summary = self.queue.job_summary(now).await?;
        if summary.count(JobState::Ready) + summary.count(JobState::Running) > 0 {
            return Ok(false);
        }
        Ok(!self.queue.reconcile(now).await?.changed())
    }

    /// How long to wait for work when nothing is due: until the next job
    /// falls due or lease expires, at most `poll`. A lease that lapsed on
    /// its job's last attempt is ended here (reconcile), at its expiry: no
    /// claim takes it, and the job would otherwise count as running until
    /// the next periodic reconcile (forever, with `until_idle`).
    async fn idle_wait(&self) -> Result<Duration, StoreError> {
        let now = self.clock.now_ms();
        let summary = self.queue.job_summary(now).await?;
        if summary.lapsed_on_last_attempt > 0 {
            let report = self.queue.reconcile(now).await?;
            tracing::info!(
                ?report,
                "reconciled a lease that lapsed on its last attempt"
            );
            if report.dead_expired_leases > 0 {
                return Ok(Duration::ZERO);
            }
        }
        let until_due = summary
            .next_due_at
            .map(|at| Duration::from_millis((at - now).max(0) as u64))
            .unwrap_or(self.opts.poll);
        Ok(until_due.min(self.opts.poll))
    }

    fn shutdown_now(&mut self) {
        let (stop, stopped) = watch::channel(true);
        drop(stop);
        self.shutdown = stopped;
    }
}

/// A busy slot: runs its attempt, then each job its completion claimed for
/// it in the same transaction, until one comes back without a successor.
struct Slot {
    sched: Arc<Scheduler>,
    stats: Arc<WorkerStats>,
    wake: Arc<Notify>,
    shutdown: watch::Receiver<bool>,
}

impl Slot {
    async fn run(self, first: ClaimedJob) -> Result<(), StoreError> {
        let mut job = first;
        loop {
            let claim_next = !*self.shutdown.borrow();
            let (finished, next) = match self.sched.run_claimed_then_claim(job, claim_next).await {
                Ok(done) => done,
                // One attempt the database refused to complete and to fail
                // (the scheduler logged it): only it is given up, never the
                // worker. Its lease lapses; it is retried or, on its last
                // attempt, ends dead.
                Err(e) if e.is_refusal() => return Ok(()),
                // A store that cannot be reached right now (the producer
                // backs off), or a bug (the worker stops).
                Err(e) => return Err(e),
            };
            self.count(&finished.outcome);
            if let AttemptOutcome::Succeeded { released, .. } = &finished.outcome
                && released.len() > usize::from(next.is_some())
            {
                // More became ready than this slot took: wake the producer.
                self.wake.notify_waiters();
            }
            match next {
                Some(next) => job = next,
                None => return Ok(()),
            }
        }
    }

    fn count(&self, outcome: &AttemptOutcome) {
        self.stats.attempts.fetch_add(1, Ordering::Relaxed);
        let counter = match outcome {
            AttemptOutcome::Succeeded { .. } => &self.stats.succeeded,
            AttemptOutcome::Retrying { .. } => &self.stats.retried,
            AttemptOutcome::Dead { .. } => &self.stats.dead,
            AttemptOutcome::LeaseLost => &self.stats.lease_lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
