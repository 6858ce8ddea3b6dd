//! Plugin contract 0.2.0 beside 0.1.0: a component built against the old
//! contract runs unchanged; a 0.2.0 stage's chat with structured output,
//! clock and random numbers replay across attempts; an answer that does not
//! fit its schema is retried and never handed to the stage.
//!
//! Each test says the buggy shape it was seen failing on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use ratchet_runtime::clock::ManualClock;
use ratchet_runtime::llm::{Answer, ModelBackend, ModelError, ModelRequest, StochasticModel};
use ratchet_runtime::plugin::{Contract, HostConfig};
use ratchet_runtime::scheduler::{AttemptOutcome, Scheduler};
use ratchet_tests::{Backend, Harness, plugin_path, shared_component_cache};
use serde_json::Value;

/// One stage fed the run's input as `topic`.
fn pipeline(plugin: &str) -> String {
    format!(
        "name = \"{plugin}\"\n[[stage]]\nname = \"{plugin}\"\nplugin = \"{plugin}@^1\"\ninputs = {{ topic = \"$input\" }}\n"
    )
}

/// 2026-03-14T12:00:00Z: the middle of a day, so an attempt's own running
/// time never moves its date.
const FIRST_CLAIM_MS: i64 = 1_773_489_600_000;
const DAY_MS: i64 = 86_400_000;

async fn harness(
    backend: Backend,
    model: Arc<dyn ModelBackend>,
) -> Option<(Arc<ManualClock>, Harness)> {
    let clock = Arc::new(ManualClock::new(FIRST_CLAIM_MS));
    let config = HostConfig {
        cache_dir: Some(shared_component_cache()),
        ..HostConfig::default()
    };
    let h = Harness::configured(backend, clock.clone(), model, config).await?;
    Some((clock, h))
}

/// Claims the job that is due and runs its attempt.
async fn next_attempt(sched: &Scheduler) -> AttemptOutcome {
    let job = sched.claim(None).await.expect("claim").expect("due");
    sched.run_claimed(job).await.expect("run").outcome
}

ratchet_tests::backend_tests! {
    a_component_built_against_0_1_runs_unchanged => runs_0_1;
    the_date_and_random_pick_in_a_prompt_replay_on_a_retry => clock_and_random_replay;
    an_answer_that_does_not_fit_its_schema_is_retried_not_handed_over => schema_misfit_retried;
}

/// The 0.1.0 component's first attempt fails after its model call; the
/// retry is handed the journaled answer and commits it. Seen failing with
/// the 0.1.0 bindings left out of the linker (registration refused: the
/// component's imports are not provided).
async fn runs_0_1(backend: Backend) {
    let Some((clock, h)) = harness(backend, Arc::new(StochasticModel)).await else {
        return;
    };
    h.register(&["contract-0-1"]).await;
    let plugins = h.store.plugin_list().await.expect("plugins");
    assert_eq!(
        plugins[0].contract, "0.1.0",
        "registered under its contract"
    );
    let run = h
        .submit(&pipeline("contract-0-1"), b"the old contract")
        .await;
    let sched = h.scheduler("w", 30_000);
    let outcome = next_attempt(&sched).await;
    let AttemptOutcome::Retrying { at, .. } = outcome else {
        panic!("attempt 1 fails after its model call: {outcome:?}");
    };
    clock.set(at);
    let outcome = next_attempt(&sched).await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let calls = h.store.model_call_list(&run).await.expect("journal");
    assert_eq!(calls.len(), 1, "asked once: {calls:?}");
    let draft = h
        .store
        .artifact_get(&run, "contract-0-1", "draft")
        .await
        .expect("read")
        .expect("committed");
    assert_eq!(draft.bytes, calls[0].response.as_bytes());
    assert_eq!(
        calls[0].finish_reason,
        Some(ratchet_runtime::llm::FinishReason::Stop)
    );
}

/// Which contract `plugin show` and the registry report, read from the
/// components' imports. Seen failing with every component taken as the
/// latest contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_component_is_run_under_the_contract_it_imports() {
    let h = Harness::new().await;
    for (name, contract) in [
        ("contract-0-1", Contract::V0_1),
        ("brief", Contract::V0_2),
        ("noop", Contract::V0_2),
    ] {
        let bytes = std::fs::read(plugin_path(name)).expect("compiled plugin");
        let loaded = h.host.inspect(&bytes).await.expect("inspect");
        assert_eq!(loaded.contract(), contract, "{name}");
    }
}

/// `brief` puts the date and a random angle into its prompt; its first
/// attempt fails after the model call, and the retry runs two days later.
/// It must ask the same question (the first attempt's date, the same pick)
/// and commit the journaled answer. Seen failing with the wall clock left
/// at the host's time (the retry asked with another date: non-determinism,
/// the run failed) and with the host's random generator unseeded (another
/// angle, the same failure).
async fn clock_and_random_replay(backend: Backend) {
    let Some((clock, h)) = harness(backend, Arc::new(StochasticModel)).await else {
        return;
    };
    h.register(&["brief"]).await;
    let run = h.submit(&pipeline("brief"), b"releases, fail once").await;
    let sched = h.scheduler("w", 30_000);
    let outcome = next_attempt(&sched).await;
    assert!(
        matches!(outcome, AttemptOutcome::Retrying { .. }),
        "{outcome:?}"
    );
    clock.set(FIRST_CLAIM_MS + 2 * DAY_MS);
    let outcome = next_attempt(&sched).await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let brief = h.json(&run, "brief", "brief").await;
    assert_eq!(
        brief["date"], "2026-03-14",
        "the first attempt's date: {brief}"
    );
    let calls = h.store.model_call_list(&run).await.expect("journal");
    assert_eq!(calls.len(), 1, "asked once: {calls:?}");
    assert_eq!(calls[0].attempt, 1);
    let journaled: Value = serde_json::from_str(&calls[0].response).expect("JSON answer");
    assert_same_answer(&brief["answer"], &journaled);
}

/// The brief holds the journaled answer, not a new one (compared field by
/// field: the stage writes an absent `source` as `null`).
fn assert_same_answer(proposed: &Value, journaled: &Value) {
    for field in ["headline", "excitement", "points", "tone"] {
        assert_eq!(
            proposed[field], journaled[field],
            "{field}: {proposed} vs {journaled}"
        );
    }
    assert!(proposed["headline"].is_string(), "{proposed}");
}

/// Answers its first question with JSON that does not fit, then asks the
/// built-in backend.
#[derive(Default)]
struct MisfitFirst(AtomicU32);

#[async_trait]
impl ModelBackend for MisfitFirst {
    fn name(&self) -> String {
        "misfit-first".into()
    }

    async fn generate(&self, request: &ModelRequest) -> Result<Answer, ModelError> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return Ok(Answer::text(r#"{"headline": 42}"#));
        }
        StochasticModel.generate(request).await
    }
}

/// The first answer does not fit `brief`'s schema: the attempt fails
/// retryably, nothing is journaled, and the retry's fitting answer is the
/// one committed. Seen failing with the host's schema check removed (the
/// misfit was journaled and handed over; the stage could not decode it and
/// failed the run).
async fn schema_misfit_retried(backend: Backend) {
    let model = Arc::new(MisfitFirst::default());
    let Some((clock, h)) = harness(backend, model.clone()).await else {
        return;
    };
    h.register(&["brief"]).await;
    let run = h.submit(&pipeline("brief"), b"schemas").await;
    let sched = h.scheduler("w", 30_000);
    let outcome = next_attempt(&sched).await;
    let AttemptOutcome::Retrying { at, error } = outcome else {
        panic!("a misfit fails the attempt retryably: {outcome:?}");
    };
    assert!(error.contains("does not fit the schema"), "{error}");
    assert!(
        h.store
            .model_call_list(&run)
            .await
            .expect("journal")
            .is_empty()
    );
    clock.set(at);
    let outcome = next_attempt(&sched).await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let calls = h.store.model_call_list(&run).await.expect("journal");
    assert_eq!((calls.len(), calls[0].attempt), (1, 2), "{calls:?}");
    let brief = h.json(&run, "brief", "brief").await;
    let journaled: Value = serde_json::from_str(&calls[0].response).expect("JSON answer");
    assert_same_answer(&brief["answer"], &journaled);
    assert_eq!(model.0.load(Ordering::SeqCst), 2);
}
