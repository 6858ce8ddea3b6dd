//! A worker running inside the caller's tokio runtime, stopped gracefully.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::ClientError;
use crate::clock::Clock;
use crate::scheduler::Scheduler;
use crate::store::Store;
use crate::worker::{self, WorkerError, WorkerOptions, WorkerStats};

/// A worker started by [`super::Client::worker`]. Dropping it leaves the
/// worker running until the runtime shuts down; [`WorkerHandle::stop`]
/// ends it.
#[derive(Debug)]
pub struct WorkerHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<Arc<WorkerStats>, WorkerError>>,
}

impl WorkerHandle {
    pub(super) fn start(
        store: Arc<dyn Store>,
        sched: Arc<Scheduler>,
        clock: Arc<dyn Clock>,
        options: WorkerOptions,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(worker::run(store, sched, clock, options, stopped));
        Self { stop, task }
    }

    /// Asks the worker to claim nothing more and waits up to `grace` for
    /// its attempts in flight to finish. Past `grace` they are abandoned:
    /// their leases expire and another worker retries them.
    pub async fn stop(mut self, grace: Duration) -> Result<Arc<WorkerStats>, ClientError> {
        let _ = self.stop.send(true);
        match tokio::time::timeout(grace, &mut self.task).await {
            Ok(joined) => Self::joined(joined),
            Err(_) => {
                self.task.abort();
                Err(ClientError::Abandoned(grace))
            }
        }
    }

    /// Waits for a worker started with `until_idle` to run out of work.
    pub async fn join(self) -> Result<Arc<WorkerStats>, ClientError> {
        Self::joined(self.task.await)
    }

    fn joined(
        joined: Result<Result<Arc<WorkerStats>, WorkerError>, tokio::task::JoinError>,
    ) -> Result<Arc<WorkerStats>, ClientError> {
        let stats = joined.map_err(|e| WorkerError::Panicked(e.to_string()))??;
        Ok(stats)
    }
}
