//! The worker loop: N tasks claiming and running attempts, woken by in-process
//! releases or a slow poll; reconciles on start and periodically.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::scheduler::{AttemptOutcome, Scheduler};
use crate::store::{JobState, StoreError};

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub concurrency: usize,
    /// Return once no job is ready or running anywhere in the store.
    pub until_idle: bool,
    /// Longest wait between claims when nothing wakes the worker.
    pub poll: Duration,
    pub reconcile_every: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            concurrency: 4,
            until_idle: false,
            poll: Duration::from_millis(200),
            reconcile_every: Duration::from_secs(10),
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

/// Runs worker tasks until `shutdown` turns true (or, with `until_idle`,
/// until there is nothing left to do). In-flight attempts finish first.
pub async fn run(
    sched: Arc<Scheduler>,
    clock: Arc<dyn Clock>,
    opts: WorkerOptions,
    shutdown: watch::Receiver<bool>,
) -> Result<Arc<WorkerStats>, WorkerError> {
    let stats = Arc::new(WorkerStats::default());
    let wake = Arc::new(Notify::new());
    sched.store().listen_ready(wake.clone());
    let report = sched.store().reconcile(clock.now_ms()).await?;
    if report != Default::default() {
        tracing::info!(?report, "reconciled on start");
    }
    let mut tasks = JoinSet::new();
    for _ in 0..opts.concurrency.max(1) {
        let task = Task {
            sched: sched.clone(),
            clock: clock.clone(),
            opts: opts.clone(),
            stats: stats.clone(),
            wake: wake.clone(),
            shutdown: shutdown.clone(),
        };
        tasks.spawn(task.run());
    }
    if !opts.until_idle {
        let (sched, clock, mut shutdown, every) = (
            sched.clone(),
            clock.clone(),
            shutdown.clone(),
            opts.reconcile_every,
        );
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.changed() => return Ok(()),
                    _ = tokio::time::sleep(every) => {}
                }
                match sched.store().reconcile(clock.now_ms()).await {
                    Ok(r) if r != Default::default() => tracing::info!(report = ?r, "reconciled"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("reconcile failed: {e}"),
                }
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tasks.abort_all();
                return Err(e.into());
            }
            Err(e) if e.is_panic() => {
                tasks.abort_all();
                return Err(WorkerError::Panicked(panic_message(e.into_panic())));
            }
            Err(_) => {}
        }
    }
    Ok(stats)
}

enum Step {
    Worked,
    Wait(Duration),
    Done,
}

struct Task {
    sched: Arc<Scheduler>,
    clock: Arc<dyn Clock>,
    opts: WorkerOptions,
    stats: Arc<WorkerStats>,
    wake: Arc<Notify>,
    shutdown: watch::Receiver<bool>,
}

impl Task {
    async fn run(mut self) -> Result<(), StoreError> {
        let mut store_errors = 0u32;
        while !*self.shutdown.borrow() {
            let notified = self.wake.notified();
            let wait = match self.step().await {
                Ok(Step::Worked) => {
                    store_errors = 0;
                    continue;
                }
                Ok(Step::Wait(wait)) => {
                    store_errors = 0;
                    wait
                }
                Ok(Step::Done) => {
                    self.wake.notify_waiters();
                    return Ok(());
                }
                // A restarting database or a dropped connection: back off and
                // try again; the pool reconnects. Anything else stops the worker.
                Err(e) if e.is_transient() => {
                    store_errors = store_errors.saturating_add(1);
                    let backoff = Duration::from_millis(100u64 << store_errors.min(6));
                    tracing::warn!("store unavailable, retrying in {backoff:?}: {e}");
                    backoff
                }
                Err(e) => return Err(e),
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(wait) => {}
                _ = self.shutdown.changed() => {}
            }
        }
        Ok(())
    }

    async fn step(&self) -> Result<Step, StoreError> {
        if let Some(finished) = self.sched.run_next().await? {
            self.count(&finished.outcome);
            if let AttemptOutcome::Succeeded { released, .. } = &finished.outcome
                && !released.is_empty()
            {
                self.wake.notify_waiters();
            }
            return Ok(Step::Worked);
        }
        Ok(match self.idle_wait().await? {
            Some(wait) => Step::Wait(wait),
            None => Step::Done,
        })
    }

    /// How long to wait for work; `None` when `until_idle` and all is done.
    async fn idle_wait(&self) -> Result<Option<Duration>, StoreError> {
        let now = self.clock.now_ms();
        let summary = self.sched.store().job_summary(now).await?;
        let busy = summary.count(JobState::Ready) + summary.count(JobState::Running);
        if self.opts.until_idle && busy == 0 {
            let repaired = self.sched.store().reconcile(now).await?;
            if repaired == Default::default() {
                return Ok(None);
            }
            return Ok(Some(Duration::ZERO));
        }
        let until_due = summary
            .next_due_at
            .map(|at| Duration::from_millis((at - now).max(0) as u64))
            .unwrap_or(self.opts.poll);
        Ok(Some(until_due.min(self.opts.poll)))
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
