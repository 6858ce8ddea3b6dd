//! Group commit: completions that arrive while one transaction commits wait
//! and go together in the next one, with a claim for every attempt that
//! asked for its successor: one durable commit for many stages. Nothing
//! waits for a batch to fill, with one exception: jobs claimed together
//! (by a batch for its slots, or by the worker's producer for free slots)
//! started together and tend to finish together, so the next batch waits
//! for as many completions as that while they keep coming: until none came
//! for a moment (`linger`), and never more than [`MOST_LINGERS`] of them.
//! Without it, the first of them found the committer idle and committed
//! almost alone, and batches alternated between nearly all the slots and
//! one or two (ADR 0014). A cohort of Wasm stages takes longer than one
//! `linger` to arrive (ADR 0016).
//!
//! Where the store takes parallel writers (Postgres), each committer has a
//! queue of its own and a run's completions always go to the same one. The
//! stages of a fan-out then share batches instead of racing each other for
//! their join's row lock: a batch decrements the join once, and no other
//! committer of this worker waits on it.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::SchedulerProbe;
use crate::clock::Clock;
use crate::store::{
    ClaimedJob, CompleteOutcome, JobBatch, JobBatchOutcome, JobClaim, JobComplete, Queue,
    StoreError,
};

/// The longest a batch waits for its cohort, in `linger`s: a cohort that
/// keeps trickling in is not waited for past this.
pub(super) const MOST_LINGERS: u32 = 8;

/// A completion's own outcome, and the job claimed for its slot, if asked.
pub(super) type Answer = Result<(CompleteOutcome, Option<ClaimedJob>), StoreError>;

/// A completion, and who is waiting for it.
struct Request {
    complete: JobComplete,
    waiter: Waiter,
}

struct Waiter {
    claim_next: bool,
    reply: oneshot::Sender<Answer>,
}

/// How many completions went through, in how many transactions.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub completions: AtomicU64,
    pub transactions: AtomicU64,
}

/// Where batches go: the store, or a test's stand-in.
pub(super) trait CommitBatch: Send + Sync + 'static {
    fn commit(
        &self,
        batch: &JobBatch,
    ) -> impl Future<Output = Result<JobBatchOutcome, StoreError>> + Send;
}

impl CommitBatch for Arc<dyn Queue> {
    async fn commit(&self, batch: &JobBatch) -> Result<JobBatchOutcome, StoreError> {
        self.job_batch(batch).await
    }
}

/// Who claims, for how long, on which clock.
pub(super) struct Claimer {
    pub worker: String,
    pub lease_ms: i64,
    pub clock: Arc<dyn Clock>,
    pub probe: Option<Arc<dyn SchedulerProbe>>,
    pub caps: Arc<[crate::store::PluginCap]>,
}

pub(super) struct GroupCommit<C = Arc<dyn Queue>> {
    committer: Arc<Committer<C>>,
    /// Committer tasks, each with a queue of its own.
    parallel: usize,
    /// The committer tasks start on the first completion, inside the
    /// caller's runtime, and each ends when its queue's sender is dropped.
    queues: OnceLock<Vec<mpsc::UnboundedSender<Request>>>,
}

impl<C: CommitBatch> GroupCommit<C> {
    /// `parallel` committers, each committing up to `max_batch` requests
    /// per transaction, and waiting up to `linger` for the completions of
    /// the jobs its last batch claimed.
    pub(super) fn new(
        target: C,
        max_batch: usize,
        parallel: usize,
        linger: Duration,
        claimer: Claimer,
    ) -> Self {
        let parallel = parallel.max(1);
        Self {
            parallel,
            committer: Arc::new(Committer {
                target,
                max_batch: max_batch.max(1),
                parallel,
                linger,
                stats: Arc::default(),
                claimer,
                claimed_outside: (0..parallel).map(|_| AtomicUsize::new(0)).collect(),
            }),
            queues: OnceLock::new(),
        }
    }

    pub(super) fn stats(&self) -> &Arc<CommitStats> {
        &self.committer.stats
    }

    /// Tells the committers of `jobs`, claimed outside any batch (by the
    /// worker's producer), that their completions are coming together.
    pub(super) fn expect(&self, jobs: &[ClaimedJob]) {
        for job in jobs {
            let queue = queue_of(&job.run_id, self.parallel);
            self.committer.claimed_outside[queue].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Commits `c`, alone or with whatever else is waiting, and with
    /// `claim_next` claims a job for the caller in the same transaction.
    /// The answer is `c`'s own; so is an error: a batch that fails is
    /// retried one request per transaction before anyone is answered.
    pub(super) async fn complete(&self, c: JobComplete, claim_next: bool) -> Answer {
        let queues = self.queues.get_or_init(|| {
            (0..self.parallel)
                .map(|index| {
                    let (send, receive) = mpsc::unbounded_channel();
                    tokio::spawn(self.committer.clone().run(index, receive));
                    send
                })
                .collect()
        });
        let queue = &queues[queue_of(&c.job.run_id, self.parallel)];
        let (reply, answer) = oneshot::channel();
        let request = Request {
            complete: c,
            waiter: Waiter { claim_next, reply },
        };
        queue
            .send(request)
            .map_err(|_| StoreError::CommitterStopped)?;
        answer.await.map_err(|_| StoreError::CommitterStopped)?
    }
}

/// The committer a run's completions go to, of `parallel`.
fn queue_of(run_id: &str, parallel: usize) -> usize {
    let mut hasher = DefaultHasher::new();
    run_id.hash(&mut hasher);
    (hasher.finish() % parallel as u64) as usize
}

struct Committer<C> {
    target: C,
    max_batch: usize,
    parallel: usize,
    linger: Duration,
    stats: Arc<CommitStats>,
    claimer: Claimer,
    /// Per queue: jobs claimed outside a batch since that queue's committer
    /// last gathered (see [`GroupCommit::expect`]).
    claimed_outside: Vec<AtomicUsize>,
}

impl<C: CommitBatch> Committer<C> {
    /// Takes what is waiting and commits it, until the queue's sender is
    /// gone. `index` is this committer's queue.
    async fn run(self: Arc<Self>, index: usize, mut queue: mpsc::UnboundedReceiver<Request>) {
        let mut waiting = Vec::with_capacity(self.max_batch);
        // The jobs claimed for slots whose completions come to this queue,
        // by its last batch and by the producer since: they started
        // together.
        let mut cohort = 0;
        loop {
            let taken = queue.recv_many(&mut waiting, self.max_batch).await;
            if taken == 0 {
                return;
            }
            cohort += self.claimed_outside[index].swap(0, Ordering::Relaxed);
            self.gather(&mut queue, &mut waiting, cohort).await;
            let (completions, waiters): (Vec<_>, Vec<_>) =
                waiting.drain(..).map(|r| (r.complete, r.waiter)).unzip();
            let answers = self.commit(completions, &waiters).await;
            cohort = answers
                .iter()
                .filter_map(|a| a.as_ref().ok()?.1.as_ref())
                .filter(|job| queue_of(&job.run_id, self.parallel) == index)
                .count();
            for (waiter, answer) in waiters.into_iter().zip(answers) {
                // The attempt that asked may be gone (a worker shutting
                // down): what was committed stays committed, and a job
                // claimed for it is taken over when its lease expires.
                let _ = waiter.reply.send(answer);
            }
        }
    }

    /// Waits until `waiting` holds as many requests as the cohort (at most a
    /// batch), the queue closes, no request came for `linger`, or
    /// `MOST_LINGERS` of it have passed since the wait began.
    async fn gather(
        &self,
        queue: &mut mpsc::UnboundedReceiver<Request>,
        waiting: &mut Vec<Request>,
        cohort: usize,
    ) {
        let want = cohort.min(self.max_batch);
        if waiting.len() >= want || self.linger.is_zero() {
            return;
        }
        let last = tokio::time::Instant::now() + self.linger * MOST_LINGERS;
        while waiting.len() < want {
            let room = self.max_batch - waiting.len();
            let deadline = (tokio::time::Instant::now() + self.linger).min(last);
            match tokio::time::timeout_at(deadline, queue.recv_many(waiting, room)).await {
                Ok(taken) if taken > 0 => {}
                _ => return,
            }
        }
    }

    async fn commit(&self, completions: Vec<JobComplete>, waiters: &[Waiter]) -> Vec<Answer> {
        self.stats
            .completions
            .fetch_add(waiters.len() as u64, Ordering::Relaxed);
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        crate::metrics::commit_batch(waiters.len());
        let batch = self.batch(completions, waiters);
        let e = match self.target.commit(&batch).await {
            Ok(outcome) => return self.answers(&batch, waiters, outcome),
            Err(e) if waiters.len() == 1 => return vec![Err(e)],
            Err(e) => e,
        };
        tracing::debug!(
            size = waiters.len(),
            "a group commit failed, committing its completions one by one: {e}"
        );
        let mut answers = Vec::with_capacity(waiters.len());
        for (complete, waiter) in batch.completions.into_iter().zip(waiters) {
            self.stats.transactions.fetch_add(1, Ordering::Relaxed);
            let one = std::slice::from_ref(waiter);
            let alone = self.batch(vec![complete], one);
            match self.target.commit(&alone).await {
                Ok(outcome) => answers.extend(self.answers(&alone, one, outcome)),
                Err(e) => answers.push(Err(e)),
            }
        }
        answers
    }

    fn batch(&self, completions: Vec<JobComplete>, waiters: &[Waiter]) -> JobBatch {
        let wanted = waiters.iter().filter(|w| w.claim_next).count();
        JobBatch {
            completions,
            claim: (wanted > 0).then(|| JobClaim {
                worker: self.claimer.worker.clone(),
                now: self.claimer.clock.now_ms(),
                lease_ms: self.claimer.lease_ms,
                limit: wanted,
                only_job: None,
                caps: self.claimer.caps.clone(),
            }),
        }
    }

    /// Each completion's outcome, and the claimed jobs handed out in
    /// request order to those that asked.
    fn answers(
        &self,
        batch: &JobBatch,
        waiters: &[Waiter],
        outcome: JobBatchOutcome,
    ) -> Vec<Answer> {
        if let Some(probe) = &self.claimer.probe {
            for (complete, completed) in batch.completions.iter().zip(&outcome.completed) {
                if let CompleteOutcome::Completed { released, .. } = completed {
                    probe.released(&complete.job.run_id, released);
                }
            }
        }
        crate::metrics::claimed(&outcome.claimed);
        let mut claimed = outcome.claimed.into_iter();
        waiters
            .iter()
            .zip(outcome.completed)
            .map(|(waiter, completed)| {
                let next = waiter.claim_next.then(|| claimed.next()).flatten();
                Ok((completed, next))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
