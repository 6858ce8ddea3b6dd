use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::Notify;

use super::*;
use crate::clock::ManualClock;

/// Records each batch (its job ids and claim limit); holds the first
/// one until `open` is notified; fails any batch holding job `poison`;
/// claims jobs numbered from 100.
#[derive(Default)]
struct Gate {
    batches: Mutex<Vec<(Vec<i64>, usize)>>,
    entered: Notify,
    open: Notify,
    poison: Option<i64>,
}

impl CommitBatch for Gate {
    async fn commit(&self, batch: &JobBatch) -> Result<JobBatchOutcome, StoreError> {
        let ids: Vec<i64> = batch.completions.iter().map(|c| c.job_id).collect();
        let limit = batch.claim.as_ref().map_or(0, |c| c.limit);
        let first = {
            let mut batches = self.batches.lock().expect("batches");
            batches.push((ids.clone(), limit));
            batches.len() == 1
        };
        if first {
            self.entered.notify_one();
            self.open.notified().await;
        }
        if ids.iter().any(|id| Some(*id) == self.poison) {
            return Err(StoreError::Corrupt {
                table: "jobs",
                detail: "poisoned".into(),
            });
        }
        Ok(JobBatchOutcome {
            completed: ids
                .iter()
                .map(|id| CompleteOutcome::Completed {
                    outputs: Vec::new(),
                    released: vec![format!("after-{id}")],
                })
                .collect(),
            claimed: (0..limit).map(|i| claimed(100 + i as i64)).collect(),
            ending: Vec::new(),
        })
    }
}

fn claimed(job_id: i64) -> ClaimedJob {
    ClaimedJob::fixture(job_id, format!("s{job_id}"))
}

fn completion(job_id: i64) -> JobComplete {
    JobComplete {
        job_id,
        attempt: 1,
        worker: "w".into(),
        job: (&claimed(job_id)).into(),
        outputs: Vec::new(),
        input_digests: BTreeMap::new(),
        now: 0,
    }
}

/// Odd jobs ask for their successor.
fn wants_next(job: i64) -> bool {
    job % 2 == 1
}

type Batches = Vec<(Vec<i64>, usize)>;

/// `parallel` committers in front of `gate`, batches of up to 64.
fn committer(gate: Gate, parallel: usize, linger: Duration) -> Arc<GroupCommit<Gate>> {
    let claimer = Claimer {
        worker: "w".into(),
        lease_ms: 1_000,
        clock: Arc::new(ManualClock::new(0)),
        probe: None,
        caps: Arc::new([]),
    };
    Arc::new(GroupCommit::new(gate, 64, parallel, linger, claimer))
}

/// Holds the commit of job 0, queues each `(job, claim_next)` behind
/// it, lets it go, and returns every answer, job 0's first.
async fn hold_first_queue_then_open(
    commits: &Arc<GroupCommit<Gate>>,
    jobs: impl Iterator<Item = (i64, bool)>,
) -> Vec<Answer> {
    let first = tokio::spawn({
        let commits = commits.clone();
        async move { commits.complete(completion(0), false).await }
    });
    commits.committer.target.entered.notified().await;
    let mut queued = Vec::new();
    for (job, claim_next) in jobs {
        let commits = commits.clone();
        let (sent, was_sent) = oneshot::channel();
        queued.push(tokio::spawn(async move {
            let answer = commits.complete(completion(job), claim_next);
            let mut answer = std::pin::pin!(answer);
            // Polled once, the request is on the queue.
            let _ = futures_poll_once(answer.as_mut()).await;
            let _ = sent.send(());
            answer.await
        }));
        was_sent.await.expect("queued");
    }
    commits.committer.target.open.notify_one();
    let mut answers = vec![first.await.expect("first")];
    answers.extend(futures_join(queued).await);
    answers
}

/// Holds the first commit, queues `later` more behind it, lets it go,
/// and returns every answer with the batches the target saw.
/// All of one run, through `parallel` committers.
async fn hold_first_then_queue(gate: Gate, later: i64, parallel: usize) -> (Vec<Answer>, Batches) {
    let commits = committer(gate, parallel, Duration::ZERO);
    let answers =
        hold_first_queue_then_open(&commits, (1..=later).map(|j| (j, wants_next(j)))).await;
    let batches = commits
        .committer
        .target
        .batches
        .lock()
        .expect("batches")
        .clone();
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
    let (answers, batches) = hold_first_then_queue(Gate::default(), 5, 1).await;
    assert_eq!(batches, vec![(vec![0], 0), (vec![1, 2, 3, 4, 5], 3)]);
    let mut handed_out = Vec::new();
    for (job, answer) in answers.into_iter().enumerate() {
        let Ok((CompleteOutcome::Completed { released, .. }, next)) = answer else {
            panic!("job {job}: {answer:?}");
        };
        assert_eq!(released, vec![format!("after-{job}")], "each gets its own");
        assert_eq!(next.is_some(), wants_next(job as i64), "job {job}");
        handed_out.extend(next.map(|n| n.job_id));
    }
    assert_eq!(handed_out, [100, 101, 102], "one claim, in request order");
}

/// With one queue shared by all committers, idle committers took each
/// of the run's later completions alone, and on Postgres they queued on
/// their join's row lock.
#[tokio::test]
async fn a_runs_completions_go_through_one_of_the_parallel_committers() {
    let (answers, batches) = hold_first_then_queue(Gate::default(), 5, 4).await;
    assert_eq!(batches, vec![(vec![0], 0), (vec![1, 2, 3, 4, 5], 3)]);
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
}

/// A committer with `linger` whose second batch claimed jobs 100, 101
/// and 102 for the slots of jobs 1, 2 and 3: the first batch (job 0)
/// is held until those three are queued behind it.
async fn committer_with_a_cohort_of_three(linger: Duration) -> Arc<GroupCommit<Gate>> {
    let commits = committer(Gate::default(), 1, linger);
    let answers = hold_first_queue_then_open(&commits, (1..=3).map(|j| (j, true))).await;
    let claimed: Vec<i64> = answers[1..]
        .iter()
        .map(|a| {
            a.as_ref()
                .expect("answer")
                .1
                .as_ref()
                .expect("a successor")
                .job_id
        })
        .collect();
    assert_eq!(claimed, [100, 101, 102]);
    commits
}

async fn futures_join<T>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

/// Completes `jobs` one after another, each once the committer had
/// time to take the one before and, with a `gap`, that long later on
/// the (paused) clock; every batch the target saw.
async fn complete_in_turn(
    commits: &Arc<GroupCommit<Gate>>,
    jobs: &[i64],
    gap: Duration,
) -> Batches {
    let mut answers = Vec::new();
    for (i, &job) in jobs.iter().enumerate() {
        if i > 0 && !gap.is_zero() {
            tokio::time::advance(gap).await;
        }
        let commits = commits.clone();
        answers.push(tokio::spawn(async move {
            commits.complete(completion(job), false).await
        }));
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }
    for answer in futures_join(answers).await {
        answer.expect("completed");
    }
    let batches = commits.committer.target.batches.lock().expect("batches");
    batches.clone()
}

/// A committer whose producer claimed `jobs` (a cohort) and whose first
/// batch is not held.
fn committer_expecting(jobs: &[i64], linger: Duration) -> Arc<GroupCommit<Gate>> {
    let commits = committer(Gate::default(), 1, linger);
    let claimed: Vec<ClaimedJob> = jobs.iter().map(|&j| claimed(j)).collect();
    commits.expect(&claimed);
    commits.committer.target.open.notify_one();
    commits
}

/// The slots a batch handed jobs to finish at nearly the same moment.
/// Without waiting for them, the first found the committer idle and
/// committed alone, and batches alternated between nearly every slot
/// and one.
#[tokio::test(flavor = "current_thread")]
async fn the_jobs_a_batch_claimed_are_committed_together_though_one_finishes_first() {
    let commits = committer_with_a_cohort_of_three(Duration::from_secs(60)).await;
    let batches = complete_in_turn(&commits, &[100, 101, 102], Duration::ZERO).await;
    assert_eq!(batches[2..], [(vec![100, 101, 102], 0)]);
}

/// The jobs a worker's producer claims for its free slots (at the start
/// of every burn-down) also start together: without counting them, the
/// first to finish was committed alone.
#[tokio::test(flavor = "current_thread")]
async fn the_jobs_the_producer_claimed_are_committed_together_though_one_finishes_first() {
    let commits = committer_expecting(&[1, 2, 3], Duration::from_secs(60));
    let batches = complete_in_turn(&commits, &[1, 2, 3], Duration::ZERO).await;
    assert_eq!(batches, [(vec![1, 2, 3], 0)]);
}

/// A cohort of Wasm stages arrives over more than one linger, each
/// completion soon after the one before. Waiting a linger from the
/// first arrival split it in two (ADR 0016).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_cohort_still_coming_is_waited_for_past_one_linger() {
    let (jobs, linger) = ((1..=6).collect::<Vec<i64>>(), Duration::from_millis(5));
    let commits = committer_expecting(&jobs, linger);
    let batches = complete_in_turn(&commits, &jobs, linger * 4 / 5).await;
    assert_eq!(batches, [(jobs, 0)]);
}

/// A cohort that keeps trickling in is not waited for past
/// `MOST_LINGERS` lingers: arrivals 0.9 of a linger apart, the ninth
/// at 7.2 lingers and the tenth at 8.1.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_trickling_cohort_is_waited_for_no_longer_than_most_lingers() {
    let (jobs, linger) = ((1..=20).collect::<Vec<i64>>(), Duration::from_millis(5));
    let commits = committer_expecting(&jobs, linger);
    let batches = complete_in_turn(&commits, &jobs, linger * 9 / 10).await;
    assert_eq!(MOST_LINGERS, 8);
    assert_eq!(batches[0].0, (1..=9).collect::<Vec<i64>>(), "{batches:?}");
}

/// A slot whose job fails or runs long never sends its completion: the
/// others are committed once the linger is over.
#[tokio::test(flavor = "current_thread")]
async fn a_cohort_that_does_not_all_come_is_committed_after_the_linger() {
    let commits = committer_with_a_cohort_of_three(Duration::from_millis(5)).await;
    let batches = tokio::time::timeout(
        Duration::from_secs(60),
        complete_in_turn(&commits, &[100], Duration::ZERO),
    )
    .await
    .expect("committed once the linger was over, not when the cohort came");
    assert_eq!(batches[2..], [(vec![100], 0)]);
}

#[tokio::test]
async fn a_failing_batch_is_retried_alone_so_only_the_culprit_fails() {
    let gate = Gate {
        poison: Some(3),
        ..Gate::default()
    };
    let (answers, batches) = hold_first_then_queue(gate, 4, 1).await;
    assert_eq!(
        batches,
        vec![
            (vec![0], 0),
            (vec![1, 2, 3, 4], 2),
            (vec![1], 1),
            (vec![2], 0),
            (vec![3], 1),
            (vec![4], 0)
        ]
    );
    for (job, answer) in answers.iter().enumerate() {
        assert_eq!(answer.is_err(), job == 3, "job {job}: {answer:?}");
    }
}
