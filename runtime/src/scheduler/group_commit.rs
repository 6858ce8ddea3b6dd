//! Group commit: completions that arrive while one transaction commits wait
//! and go together in the next one, one durable commit for many stages.
//! Nothing waits for a batch to fill, so an idle worker commits each
//! completion at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};

use crate::store::{CompleteOutcome, JobComplete, Store, StoreError};

type Answer = Result<CompleteOutcome, StoreError>;
type Request = (JobComplete, oneshot::Sender<Answer>);

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
        batch: &[JobComplete],
    ) -> impl Future<Output = Result<Vec<CompleteOutcome>, StoreError>> + Send;
}

impl CommitBatch for Arc<dyn Store> {
    async fn commit(&self, batch: &[JobComplete]) -> Result<Vec<CompleteOutcome>, StoreError> {
        self.job_complete_many(batch).await
    }
}

pub(super) struct GroupCommit<C = Arc<dyn Store>> {
    target: Arc<C>,
    max_batch: usize,
    stats: Arc<CommitStats>,
    /// The committer task starts on the first completion, inside the
    /// caller's runtime, and ends when this sender is dropped.
    queue: OnceLock<mpsc::UnboundedSender<Request>>,
}

impl<C: CommitBatch> GroupCommit<C> {
    pub(super) fn new(target: C, max_batch: usize) -> Self {
        Self {
            target: Arc::new(target),
            max_batch: max_batch.max(1),
            stats: Arc::default(),
            queue: OnceLock::new(),
        }
    }

    pub(super) fn stats(&self) -> &Arc<CommitStats> {
        &self.stats
    }

    /// Commits `c`, alone or with whatever else is waiting; the outcome is
    /// `c`'s own. So is an error: a batch that fails is retried one
    /// completion per transaction before anyone is answered.
    pub(super) async fn complete(&self, c: JobComplete) -> Answer {
        let queue = self.queue.get_or_init(|| {
            let (send, receive) = mpsc::unbounded_channel();
            let committer = Committer {
                target: self.target.clone(),
                max_batch: self.max_batch,
                stats: self.stats.clone(),
            };
            tokio::spawn(committer.run(receive));
            send
        });
        let (reply, answer) = oneshot::channel();
        queue
            .send((c, reply))
            .map_err(|_| StoreError::CommitterStopped)?;
        answer.await.map_err(|_| StoreError::CommitterStopped)?
    }
}

struct Committer<C> {
    target: Arc<C>,
    max_batch: usize,
    stats: Arc<CommitStats>,
}

impl<C: CommitBatch> Committer<C> {
    async fn run(self, mut queue: mpsc::UnboundedReceiver<Request>) {
        let mut waiting = Vec::with_capacity(self.max_batch);
        while queue.recv_many(&mut waiting, self.max_batch).await > 0 {
            let (batch, replies): (Vec<_>, Vec<_>) = waiting.drain(..).unzip();
            let answers = self.commit(&batch).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                // The attempt that asked may be gone (a worker shutting
                // down): what was committed stays committed.
                let _ = reply.send(answer);
            }
        }
    }

    async fn commit(&self, batch: &[JobComplete]) -> Vec<Answer> {
        self.stats
            .completions
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        match self.target.commit(batch).await {
            Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
            Err(e) if batch.len() == 1 => vec![Err(e)],
            Err(e) => {
                tracing::debug!(
                    size = batch.len(),
                    "a group commit failed, committing its completions one by one: {e}"
                );
                let mut answers = Vec::with_capacity(batch.len());
                for c in batch {
                    self.stats.transactions.fetch_add(1, Ordering::Relaxed);
                    let one = self.target.commit(std::slice::from_ref(c)).await;
                    answers.push(one.map(|mut outcomes| outcomes.swap_remove(0)));
                }
                answers
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use tokio::sync::Notify;

    use super::*;

    /// Records each batch; holds the first one until `open` is notified,
    /// and fails any batch holding the job `poison`.
    #[derive(Default)]
    struct Gate {
        batches: Mutex<Vec<Vec<i64>>>,
        entered: Notify,
        open: Notify,
        poison: Option<i64>,
    }

    impl CommitBatch for Gate {
        async fn commit(&self, batch: &[JobComplete]) -> Result<Vec<CompleteOutcome>, StoreError> {
            let first = {
                let mut batches = self.batches.lock().expect("batches");
                batches.push(batch.iter().map(|c| c.job_id).collect());
                batches.len() == 1
            };
            if first {
                self.entered.notify_one();
                self.open.notified().await;
            }
            if batch.iter().any(|c| Some(c.job_id) == self.poison) {
                return Err(StoreError::Corrupt {
                    table: "jobs",
                    detail: "poisoned".into(),
                });
            }
            Ok(batch
                .iter()
                .map(|c| CompleteOutcome::Completed {
                    outputs: Vec::new(),
                    released: vec![format!("after-{}", c.job_id)],
                })
                .collect())
        }
    }

    fn completion(job_id: i64) -> JobComplete {
        JobComplete {
            job_id,
            attempt: 1,
            worker: "w".into(),
            outputs: Vec::new(),
            input_digests: BTreeMap::new(),
            now: 0,
        }
    }

    /// Holds the first commit, queues `later` more behind it, lets it go,
    /// and returns every answer with the batches the target saw.
    async fn hold_first_then_queue(gate: Gate, later: i64) -> (Vec<Answer>, Vec<Vec<i64>>) {
        let commits = Arc::new(GroupCommit::new(gate, 64));
        let first = tokio::spawn({
            let commits = commits.clone();
            async move { commits.complete(completion(0)).await }
        });
        commits.target.entered.notified().await;
        let mut queued = Vec::new();
        for job in 1..=later {
            let commits = commits.clone();
            let (sent, was_sent) = oneshot::channel();
            queued.push(tokio::spawn(async move {
                let answer = commits.complete(completion(job));
                let mut answer = std::pin::pin!(answer);
                // Polled once, the request is on the queue.
                let _ = futures_poll_once(answer.as_mut()).await;
                let _ = sent.send(());
                answer.await
            }));
            was_sent.await.expect("queued");
        }
        commits.target.open.notify_one();
        let mut answers = vec![first.await.expect("first")];
        for q in queued {
            answers.push(q.await.expect("queued answer"));
        }
        let batches = commits.target.batches.lock().expect("batches").clone();
        (answers, batches)
    }

    /// Polls `fut` once and returns whether it finished.
    async fn futures_poll_once<F: Future + Unpin>(fut: F) -> bool {
        let mut fut = fut;
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::pin::Pin::new(&mut fut).poll(cx).is_ready())
        })
        .await
    }

    #[tokio::test]
    async fn completions_queued_behind_a_commit_share_the_next_transaction() {
        let (answers, batches) = hold_first_then_queue(Gate::default(), 5).await;
        assert_eq!(batches, vec![vec![0], vec![1, 2, 3, 4, 5]]);
        for (job, answer) in answers.into_iter().enumerate() {
            let Ok(CompleteOutcome::Completed { released, .. }) = answer else {
                panic!("job {job}: {answer:?}");
            };
            assert_eq!(released, vec![format!("after-{job}")], "each gets its own");
        }
    }

    #[tokio::test]
    async fn a_failing_batch_is_retried_alone_so_only_the_culprit_fails() {
        let gate = Gate {
            poison: Some(3),
            ..Gate::default()
        };
        let (answers, batches) = hold_first_then_queue(gate, 4).await;
        assert_eq!(
            batches,
            vec![
                vec![0],
                vec![1, 2, 3, 4],
                vec![1],
                vec![2],
                vec![3],
                vec![4]
            ]
        );
        for (job, answer) in answers.iter().enumerate() {
            assert_eq!(answer.is_err(), job == 3, "job {job}: {answer:?}");
        }
    }
}
