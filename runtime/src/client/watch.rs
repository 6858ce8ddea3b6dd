//! A run's changes as a program sees them: its state and its stages' at
//! first, then each change, read every `poll` until the run has finished,
//! and at once when the client's own worker or operations changed
//! something in this process, or when the store says another process may
//! have ended the run (PostgreSQL's `LISTEN`). Reading is what works on
//! both backends and across processes, and a wake only makes the read
//! early; a change shorter than `poll` (a stage that ran and succeeded in
//! between) shows as its end state.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{broadcast, watch};

use super::{ClientError, no_run};
use crate::store::{JobState, RunState, Store};

/// One change of a run or of one of its stages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunChange {
    /// The run's state, when first seen and whenever it changes.
    Run { run_id: String, state: RunState },
    /// A stage's state or attempt, when first seen and whenever either
    /// changes (an attempt taken over after a worker died is a change).
    Stage {
        run_id: String,
        stage: String,
        state: JobState,
        attempt: i64,
        last_error: Option<String>,
    },
}

/// See [`super::Client::watch`].
pub struct RunWatch {
    store: Arc<dyn Store>,
    run_id: String,
    poll: Duration,
    wakes: Wakes,
    run: Option<RunState>,
    stages: HashMap<String, (JobState, i64)>,
    pending: VecDeque<RunChange>,
    read_once: bool,
    finished: bool,
}

/// What wakes a watch before its next poll.
pub(super) struct Wakes {
    /// Moves when this process changed something through the client.
    pub changed: watch::Receiver<u64>,
    /// A run another process may have ended, or `None`: any run.
    pub ended: broadcast::Receiver<Option<Arc<str>>>,
}

impl Wakes {
    /// Returns at the next wake for `run`.
    async fn next(&mut self, run: &str) {
        let Self { changed, ended } = self;
        let changed = async {
            if changed.changed().await.is_err() {
                // The client is gone: only polls.
                std::future::pending::<()>().await;
            }
        };
        let ended = async {
            loop {
                match ended.recv().await {
                    Ok(Some(other)) if *other != *run => {}
                    // The client (and its listener) is gone: only polls.
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                    // This run, any run, or more than the backlog.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => return,
                }
            }
        };
        tokio::select! {
            () = changed => {}
            () = ended => {}
        }
    }
}

impl std::fmt::Debug for RunWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWatch")
            .field("run_id", &self.run_id)
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

impl RunWatch {
    pub(super) fn new(store: Arc<dyn Store>, run_id: &str, poll: Duration, wakes: Wakes) -> Self {
        Self {
            store,
            run_id: run_id.to_string(),
            poll,
            wakes,
            run: None,
            stages: HashMap::new(),
            pending: VecDeque::new(),
            read_once: false,
            finished: false,
        }
    }

    /// The run's state as last read.
    pub fn state(&self) -> Option<RunState> {
        self.run
    }

    /// The next change, or `None` once the run has finished and every
    /// change before has been returned.
    pub async fn next(&mut self) -> Result<Option<RunChange>, ClientError> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Ok(Some(change));
            }
            if self.finished {
                return Ok(None);
            }
            if self.read_once {
                // A change this process made, or the run's end told by the
                // store, wakes it at once; anything else is read within
                // `poll`.
                tokio::select! {
                    _ = tokio::time::sleep(self.poll) => {}
                    () = self.wakes.next(&self.run_id) => {}
                }
            }
            // Seen before reading: a change after this wakes the next wait.
            self.wakes.changed.borrow_and_update();
            self.read().await?;
        }
    }

    async fn read(&mut self) -> Result<(), ClientError> {
        // The run before its stages: a run read as finished has stages
        // that were final before they were read.
        let run = self.store.run_get(&self.run_id).await?;
        let run = run.ok_or_else(|| no_run(&self.run_id))?;
        let jobs = self.store.job_list(&self.run_id).await?;
        self.read_once = true;
        for job in jobs {
            let now = (job.state, job.attempt);
            if self.stages.get(&job.stage) == Some(&now) {
                continue;
            }
            self.stages.insert(job.stage.clone(), now);
            self.pending.push_back(RunChange::Stage {
                run_id: self.run_id.clone(),
                stage: job.stage,
                state: job.state,
                attempt: job.attempt,
                last_error: job.last_error,
            });
        }
        if self.run != Some(run.state) {
            self.run = Some(run.state);
            self.pending.push_back(RunChange::Run {
                run_id: run.id,
                state: run.state,
            });
        }
        self.finished = run.state != RunState::Running;
        Ok(())
    }
}
