//! Reliability under faults the plugin, the model server or the database
//! cause: a worker waiting for work ends a lease that lapses on its last
//! attempt; a failed run starts nothing new; text a plugin controls cannot
//! break the store, a terminal or the worker; a completion the database
//! refuses fails only its own attempt; model answers are journaled
//! losslessly, refusals included.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ratchet_runtime::clock::{Clock, ManualClock, SystemClock};
use ratchet_runtime::llm::{Answer, ModelBackend, ModelError, ModelRequest};
use ratchet_runtime::plugin::{ExecError, HostConfig};
use ratchet_runtime::scheduler::{AttemptOutcome, Scheduler, SchedulerConfig};
use ratchet_runtime::store::{JobState, RUN_FAILED_IN_FLIGHT};
use ratchet_runtime::text::MAX_ERROR_BYTES;
use ratchet_runtime::worker::{self, WorkerOptions};
use ratchet_tests::{BOUND, Backend, DEMO_PLUGINS, Harness, one_stage_pipeline};

ratchet_tests::backend_tests! {
    a_waiting_worker_ends_a_lease_that_lapses_on_its_last_attempt => lapsed_last_lease_is_ended;
    a_failed_run_starts_nothing_new_and_fences_out_its_running_attempts => failed_run_stops;
    hostile_text_fails_only_its_own_attempt_escaped_and_bounded => hostile_text_is_contained;
    a_completion_the_database_refuses_fails_only_that_attempt => refused_completion_is_contained;
    a_model_answer_holding_a_nul_is_journaled_losslessly => nul_answer_is_lossless;
    a_refused_model_call_is_journaled_and_a_retry_meets_the_refusal => refusal_is_replayed;
}

/// A clock that reads `before` once (the worker's reconcile on start) and
/// `after` from then on: the lease lapses while the worker is waiting.
struct LapsingClock {
    reads: AtomicU32,
    before: i64,
    after: i64,
}

impl Clock for LapsingClock {
    fn now_ms(&self) -> i64 {
        match self.reads.fetch_add(1, Ordering::SeqCst) {
            0 => self.before,
            _ => self.after,
        }
    }
}

/// Item 1 of #20. Seen failing before the fix: the worker claimed nothing
/// (the job's attempts are used up), counted the job as running, and never
/// reconciled, so `--until-idle` waited until this test's bound.
async fn lapsed_last_lease_is_ended(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    h.register(&["noop"]).await;
    let run = h
        .submit(&one_stage_pipeline("only", "noop", "max_attempts = 1"), b"")
        .await;
    let doomed = h.scheduler("doomed", 1_000);
    doomed
        .claim(None)
        .await
        .expect("claim")
        .expect("the only job");
    // The worker that dies holding it never finishes; the next worker
    // starts while the lease is live and sees it lapse while it waits.
    let lapsing: Arc<dyn Clock> = Arc::new(LapsingClock {
        reads: AtomicU32::new(0),
        before: 1_000_000,
        after: 1_002_000,
    });
    let sched = Arc::new(Scheduler::new(
        h.store.clone(),
        h.host.clone(),
        lapsing.clone(),
        SchedulerConfig::new("waiting"),
    ));
    let opts = WorkerOptions {
        until_idle: true,
        poll: Duration::from_millis(20),
        ..WorkerOptions::default()
    };
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::time::timeout(
        BOUND,
        worker::run(h.store.clone(), sched, lapsing, opts, stopped),
    )
    .await
    .expect("the worker noticed the lapsed lease and went idle")
    .expect("worker ran");
    let jobs = h.store.job_list(&run).await.expect("jobs");
    assert_eq!(jobs[0].state, JobState::Dead);
    assert_eq!(h.run_state(&run).await, "failed");
}

/// Item 2 of #20. Seen failing before the fix: `f`, running when `x` died,
/// was taken over by the rescuer once its lease lapsed, and its own
/// attempt's retryable failure set it back to ready in the failed run.
async fn failed_run_stops(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    h.register(&["flaky", "always-fatal"]).await;
    let pipeline = r#"
name = "doomed"
[[stage]]
name = "f"
plugin = "flaky@^1"
inputs = { config = "$input" }
[[stage]]
name = "x"
plugin = "always-fatal@^1"
"#;
    let run = h.submit(pipeline, b"3").await;
    let sched = h.scheduler("worker", 30_000);
    let mut claimed = sched.claim_many(2).await.expect("claim");
    assert_eq!(claimed.len(), 2, "both stages are roots");
    claimed.sort_by(|a, b| a.stage.cmp(&b.stage));
    let x = claimed.pop().expect("x");
    let f = claimed.pop().expect("f");
    assert_eq!((f.stage.as_str(), x.stage.as_str()), ("f", "x"));

    let outcome = sched.run_claimed(x).await.expect("run x").outcome;
    assert!(
        matches!(outcome, AttemptOutcome::Dead { .. }),
        "{outcome:?}"
    );
    assert_eq!(h.run_state(&run).await, "failed");

    clock.advance(60_000);
    let rescuer = h.scheduler("rescuer", 30_000);
    let taken = rescuer.claim(None).await.expect("claim");
    assert!(
        taken.is_none(),
        "a failed run's job was taken over: {taken:?}"
    );

    let outcome = sched.run_claimed(f).await.expect("run f").outcome;
    assert_eq!(
        outcome,
        AttemptOutcome::LeaseLost,
        "the attempt in flight is fenced out"
    );
    clock.advance(600_000);
    assert!(sched.claim(None).await.expect("claim").is_none());

    let jobs = h.store.job_list(&run).await.expect("jobs");
    let f_job = jobs.iter().find(|j| j.stage == "f").expect("f");
    assert_eq!(f_job.state, JobState::Cancelled);
    assert_eq!(f_job.attempt, 1, "f was never started again");
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    let f_attempt = attempts
        .iter()
        .find(|a| a.stage == "f")
        .expect("f's attempt");
    assert_eq!(f_attempt.outcome, "failed");
    assert_eq!(f_attempt.error.as_deref(), Some(RUN_FAILED_IN_FLIGHT));
    assert_eq!(
        h.outbox_events(&run).await,
        ["run.failed"],
        "no stage's event, the run's own"
    );
}

const HOSTILE: &str = r#"
name = "hostile"
max_attempts = 1
[[stage]]
name = "hostile"
plugin = "hostile-text@^1"
inputs = { mode = "$input" }
"#;

/// Item 3 of #20. Seen failing before the fix: on PostgreSQL the NUL in
/// `fatal-nul`'s error stopped the worker (`invalid byte sequence for
/// encoding "UTF8": 0x00`) and the demo run beside it never finished; on
/// SQLite `huge-media-type` committed a 20 MB media type past a 1 KiB
/// output limit, and errors were stored as given (NUL, escapes, 1 MiB).
async fn hostile_text_is_contained(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    h.register(&["hostile-text"]).await;
    let modes = [
        (
            "fatal-nul",
            Some("stage failed (fatal): bad\\u{0}text\\u{1b}[31mred"),
        ),
        ("retryable-nul", Some("stage failed (retryable): bad\\u{0}")),
        ("long-error", Some("stage failed (fatal): xxx")),
        ("nul-media-type", Some("has media type `bad\\u{0}text")),
        ("huge-media-type", Some("has media type `aaa")),
        ("nul-output-name", Some("output `bad\\u{0}text")),
        ("nul-log", None),
    ];
    let mut runs = Vec::new();
    for (mode, _) in &modes {
        runs.push(h.submit(HOSTILE, mode.as_bytes()).await);
    }
    let demo = h.submit_demo().await;
    h.run_until_idle(4).await;
    h.assert_demo_run_converged(&demo).await;

    for ((mode, expected), run) in modes.iter().zip(&runs) {
        let jobs = h.store.job_list(run).await.expect("jobs");
        let job = &jobs[0];
        let Some(expected) = expected else {
            assert_eq!(job.state, JobState::Succeeded, "{mode}");
            continue;
        };
        assert_eq!(job.state, JobState::Dead, "{mode}");
        let error = job.last_error.clone().unwrap_or_default();
        assert!(error.contains(expected), "{mode}: {error}");
        assert!(
            !error.chars().any(char::is_control),
            "{mode}: control characters stored: {error:?}"
        );
        assert!(
            error.len() <= MAX_ERROR_BYTES,
            "{mode}: {} bytes",
            error.len()
        );
        let attempts = h.store.attempt_list(run).await.expect("attempts");
        assert_eq!(attempts[0].error.as_deref(), Some(error.as_str()), "{mode}");
        assert!(
            h.store.artifact_list(run).await.expect("artifacts").len() == 1,
            "{mode}: only the run's input is stored"
        );
        if *mode == "long-error" {
            assert!(error.ends_with('…'), "a cut error is marked");
        }
        if mode.contains("media-type") || *mode == "nul-output-name" {
            assert!(
                error.contains("broke its output contract"),
                "{mode}: {error}"
            );
        }
    }
}

/// A completion for stage `poison` is refused by a trigger on `artifacts`.
async fn refuse_poison(h: &Harness, backend: Backend) {
    h.raw_sql(match backend {
        Backend::Sqlite => {
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON artifacts
             WHEN NEW.stage = 'poison'
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        }
        Backend::Postgres => {
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
             CREATE TRIGGER refuse_poison BEFORE INSERT ON artifacts FOR EACH ROW
             WHEN (NEW.stage = 'poison') EXECUTE FUNCTION refuse_poison()"
        }
    })
    .await;
}

/// Item 3 of #20, whatever the completion's error. Seen failing before the
/// fix: the refused completion's error was not transient, so the worker
/// aborted every attempt and exited (`worker ran` failed here).
async fn refused_completion_is_contained(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    h.register(&["noop"]).await;
    refuse_poison(&h, backend).await;
    let poison = h
        .submit(
            &one_stage_pipeline("poison", "noop", "max_attempts = 1"),
            b"",
        )
        .await;
    let demo = h.submit_demo().await;
    h.run_until_idle(2).await;
    h.assert_demo_run_converged(&demo).await;
    let jobs = h.store.job_list(&poison).await.expect("jobs");
    assert_eq!(jobs[0].state, JobState::Dead);
    let error = jobs[0].last_error.clone().unwrap_or_default();
    assert!(
        error.contains("the store refused the attempt's result")
            && error.contains("refused by the test"),
        "{error}"
    );
}

/// Answers every prompt with `answer`, or refuses the first `refusals`.
struct Scripted {
    answer: &'static str,
    refusals: u32,
    asked: AtomicU32,
}

#[async_trait]
impl ModelBackend for Scripted {
    fn name(&self) -> String {
        "scripted".into()
    }
    async fn generate(&self, _request: &ModelRequest) -> Result<Answer, ModelError> {
        if self.asked.fetch_add(1, Ordering::SeqCst) < self.refusals {
            return Err(ModelError::Rejected("no:\0quota".into()));
        }
        Ok(Answer::text(self.answer))
    }
}

async fn scripted(
    backend: Backend,
    model: Arc<Scripted>,
    clock: Arc<ManualClock>,
) -> Option<Harness> {
    let config = HostConfig {
        cache_dir: Some(ratchet_tests::shared_component_cache()),
        ..HostConfig::default()
    };
    let h = Harness::configured(backend, clock, model, config).await?;
    h.register(&DEMO_PLUGINS).await;
    Some(h)
}

/// Item 3 of #20 (a model answer is stored losslessly). Seen failing before
/// the fix on PostgreSQL: the journal's TEXT column refused the NUL, so
/// every attempt of `draft` failed to journal and the run failed.
async fn nul_answer_is_lossless(backend: Backend) {
    const ANSWER: &str = "an answer\0with a NUL and \u{1b}[31mcolour";
    let model = Arc::new(Scripted {
        answer: ANSWER,
        refusals: 0,
        asked: AtomicU32::new(0),
    });
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = scripted(backend, model, clock).await else {
        return;
    };
    let run = h.submit_demo().await;
    let sched = h.scheduler("worker", 30_000);
    let draft = sched.claim(None).await.expect("claim").expect("draft");
    let outcome = sched.run_claimed(draft).await.expect("run").outcome;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let calls = h.store.model_call_list(&run).await.expect("journal");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].response, ANSWER);
    assert!(!calls[0].rejected);
    let stored = h
        .store
        .artifact_get(&run, "draft", "draft")
        .await
        .expect("read")
        .expect("draft");
    assert_eq!(stored.bytes, ANSWER.as_bytes());
}

/// Item 9c of #20. Seen failing before the fix: the refusal left no journal
/// entry at its call index, so the retry asked the backend again at index 0
/// and got an answer (the backend asked twice, `draft` succeeding) where the
/// crashed attempt had been refused.
async fn refusal_is_replayed(backend: Backend) {
    let model = Arc::new(Scripted {
        answer: "a fine answer",
        refusals: 1,
        asked: AtomicU32::new(0),
    });
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = scripted(backend, model.clone(), clock.clone()).await else {
        return;
    };
    let run = h.submit_demo().await;
    // Attempt 1 is refused by the model, and its worker dies before it
    // records the failure.
    let crashed = h.scheduler("crashed", 1_000);
    let draft = crashed.claim(None).await.expect("claim").expect("draft");
    let execution = crashed.execute(&draft).await.expect("execute");
    assert!(
        matches!(execution.result, Err(ExecError::Fatal(_))),
        "{:?}",
        execution.result
    );
    clock.advance(2_000);

    let rescuer = h.scheduler("rescuer", 30_000);
    let retry = rescuer
        .claim(None)
        .await
        .expect("claim")
        .expect("draft again");
    assert_eq!(retry.attempt, 2);
    let execution = rescuer.execute(&retry).await.expect("execute");
    let Err(ExecError::Fatal(error)) = &execution.result else {
        panic!(
            "the retry meets the journaled refusal: {:?}",
            execution.result
        );
    };
    assert!(error.contains("quota"), "{error}");
    assert_eq!(
        model.asked.load(Ordering::SeqCst),
        1,
        "the backend was asked once"
    );
    let calls = h.store.model_call_list(&run).await.expect("journal");
    assert_eq!(calls.len(), 1);
    assert!(calls[0].rejected);
    assert_eq!(calls[0].response, "no:\0quota");
}

/// Item 4 of #20. `pg_notify` is shadowed in the test's schema (ahead of
/// `pg_catalog` on its search path) by a function that raises once the
/// test says so: the `NOTIFY` after a committed batch fails. Seen failing
/// before the fix: the committed batch came back as an error, was re-sent,
/// and the attempt was reported lease-lost though its completion stood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_that_fails_after_commit_does_not_fail_the_committed_batch() {
    let Some(url) = ratchet_tests::postgres_schema_url().await else {
        return;
    };
    let schema = url
        .split("search_path%3D")
        .nth(1)
        .and_then(|rest| rest.split('&').next())
        .expect("the schema in the url")
        .to_string();
    let admin = sqlx::PgPool::connect(&url).await.expect("postgres");
    for statement in [
        format!("CREATE TABLE {schema}.refuse_notify (refused BOOLEAN)"),
        format!(
            "CREATE FUNCTION {schema}.pg_notify(channel TEXT, payload TEXT) RETURNS void
             LANGUAGE plpgsql AS $$
             BEGIN
                 IF EXISTS (SELECT 1 FROM {schema}.refuse_notify) THEN
                     RAISE EXCEPTION 'notify refused by the test';
                 END IF;
                 PERFORM pg_catalog.pg_notify(channel, payload);
             END $$"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&admin)
            .await
            .expect("shadow pg_notify");
    }
    let url = url.replace(
        &format!("search_path%3D{schema}"),
        &format!("search_path%3D{schema}%2Cpg_catalog"),
    );
    let h = Harness::at_url(url, Arc::new(ManualClock::new(1_000_000))).await;
    h.register(&["noop", "pass"]).await;
    let run = h.submit(ratchet_tests::TWO_STAGES, b"").await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {schema}.refuse_notify VALUES (true)"
    )))
    .execute(&admin)
    .await
    .expect("refuse from now on");
    let sched = h.scheduler("worker", 30_000);
    let a = sched.claim(None).await.expect("claim").expect("a");
    let outcome = sched.run_claimed(a).await.expect("run a").outcome;
    let AttemptOutcome::Succeeded { released, .. } = outcome else {
        panic!("a committed completion is reported as such: {outcome:?}");
    };
    assert_eq!(released, ["b"]);
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let state = |s: &str| jobs.iter().find(|j| j.stage == s).expect("job").state;
    assert_eq!(
        (state("a"), state("b")),
        (JobState::Succeeded, JobState::Ready)
    );
}
