//! Canonical artifact: a retry continues only from the stored value, never
//! from its own proposal (the local value trap).

use std::sync::Arc;

use ratchet_runtime::clock::{ManualClock, SystemClock};
use ratchet_runtime::digest::sha256_hex;
use ratchet_runtime::llm::Usage;
use ratchet_runtime::scheduler::AttemptOutcome;
use ratchet_runtime::store::{ArtifactPut, ModelCallPut, Payload};
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness, output, ratchet};

ratchet_tests::backend_tests! {
    retry_after_a_crash_past_the_model_call_is_handed_the_journaled_answer => after_model_call;
    retry_after_a_crash_past_execution_is_handed_the_journaled_answer => after_execute;
    a_proposal_that_loses_to_a_committed_artifact_is_discarded_and_downstream_reads_the_winner => loser_reads_the_winner;
    racing_model_calls_converge_on_the_first_recorded_answer => racing_journal_writes;
    a_retry_that_asks_the_model_a_different_question_fails_fatally => different_question_is_fatal;
}

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

/// A worker process dies at `point` inside `draft`; the restarted one must
/// hand the journaled model answer to attempt 2 and carry it downstream.
///
/// Checked on the buggy shape: with plugin/host/model.rs skipping the
/// journal lookup and continuing from its own fresh answer after its insert
/// was ignored (the article's trap), both cases fail: the committed draft is
/// not the journaled answer.
async fn retry_is_handed_the_journaled_answer(backend: Backend, point: &str) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let run = h.submit_demo().await;

    let mut doomed = ratchet(BIN, &h.url);
    doomed
        .args([
            "worker",
            "--until-idle",
            "--concurrency",
            "1",
            "--lease-ms",
            "300",
        ])
        .env("FAILPOINTS", format!("{point}=return(exit)"));
    let out = output(doomed).await;
    assert_eq!(
        out.status.code(),
        Some(ratchet_runtime::crash::CRASH_EXIT_CODE),
        "{out:?}"
    );
    assert!(
        h.store
            .artifact_get(&run, "draft", "draft")
            .await
            .expect("read")
            .is_none()
    );
    let calls = h.store.model_call_list(&run).await.expect("journal");
    assert_eq!(calls.len(), 1, "attempt 1 journaled its one model answer");
    let answer_a = calls[0].response.clone();
    assert_eq!(calls[0].attempt, 1);

    let mut survivor = ratchet(BIN, &h.url);
    survivor.args(["worker", "--until-idle"]);
    assert!(output(survivor).await.status.success());

    let draft = h
        .store
        .artifact_get(&run, "draft", "draft")
        .await
        .expect("read")
        .expect("draft");
    assert_eq!(
        draft.meta.attempt, 2,
        "the draft was committed by the retry"
    );
    assert_eq!(
        String::from_utf8(draft.bytes).expect("text"),
        answer_a,
        "attempt 2 continued from attempt 1's journaled answer"
    );
    assert_eq!(
        h.store.model_call_list(&run).await.expect("journal").len(),
        1,
        "no new model call"
    );
    let canonical = h.assert_demo_run_converged(&run).await;
    assert_eq!(canonical, sha256_hex(answer_a.as_bytes()));
}

async fn after_model_call(backend: Backend) {
    retry_is_handed_the_journaled_answer(backend, "after_model_call").await;
}

async fn after_execute(backend: Backend) {
    retry_is_handed_the_journaled_answer(backend, "after_execute").await;
}

/// Checked on the buggy shape: with `job_complete` reporting the proposal's
/// digest as canonical (and the proposal as the winner), this test fails.
async fn loser_reads_the_winner(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let run = h.submit_demo().await;
    let sched = h.scheduler("worker", 30_000);
    let job = sched
        .claim(None)
        .await
        .expect("claim")
        .expect("draft is ready");
    assert_eq!(job.stage, "draft");

    // Artifact A is already committed for this identity, as a separately
    // committed persist (or an earlier attempt) would have left it.
    let a = b"canonical draft A, committed first".to_vec();
    let artifact_a = Payload::new("draft", "text/plain", a.clone());
    let put = ArtifactPut {
        run_id: &run,
        stage: "draft",
        artifact: &artifact_a,
        attempt: 1,
        plugin_digest: None,
        now: 0,
    };
    assert!(
        h.store
            .artifact_put_canonical(put)
            .await
            .expect("put")
            .inserted
    );

    let execution = sched.execute(&job).await.expect("execute");
    let proposal_b = execution.result.as_ref().expect("draft ran")[0]
        .bytes
        .clone();
    assert_ne!(proposal_b, a, "the model proposed something else (B)");
    let outcome = sched.finish(&job, &execution).await.expect("finish");
    let AttemptOutcome::Succeeded { outputs, .. } = outcome else {
        panic!("completion should succeed with the canonical value: {outcome:?}");
    };
    assert_eq!(outputs.len(), 1);
    assert!(!outputs[0].won, "B lost");
    assert_eq!(outputs[0].digest, sha256_hex(&a), "completion returned A");
    assert_eq!(outputs[0].proposed_digest, sha256_hex(&proposal_b));

    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    let row = attempts
        .iter()
        .find(|r| r.stage == "draft")
        .expect("attempt row");
    assert_eq!(
        row.proposal_won,
        Some(false),
        "the attempt row records that B lost"
    );
    assert_eq!(
        row.canonical_digests.as_ref().expect("canonical")["draft"],
        sha256_hex(&a)
    );
    assert_eq!(
        row.proposal_digests.as_ref().expect("proposal")["draft"],
        sha256_hex(&proposal_b)
    );

    h.run_until_idle(2).await;
    let canonical = h.assert_demo_run_converged(&run).await;
    assert_eq!(
        canonical,
        sha256_hex(&a),
        "verify, publish and prepare-next consumed A"
    );
}

async fn racing_journal_writes(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let run = h.submit_demo().await;
    let call = |response: &str, attempt| ModelCallPut {
        run_id: run.clone(),
        stage: "draft".into(),
        index: 0,
        request_digest: "same-request".into(),
        response: response.into(),
        rejected: false,
        attempt,
        now: 0,
        // The attempt's number as its answer's tokens: told apart below.
        usage: Some(Usage {
            prompt_tokens: 7,
            completion_tokens: attempt as u32,
        }),
        finish_reason: None,
        model: None,
        kind: Default::default(),
        http: None,
    };
    let first = h
        .store
        .model_call_put(call("answer A", 1))
        .await
        .expect("first");
    let second = h
        .store
        .model_call_put(call("answer B", 2))
        .await
        .expect("second");
    assert_eq!(first.response, "answer A");
    assert_eq!(
        second.response, "answer A",
        "the loser is handed the winner"
    );
    assert_eq!(second.attempt, 1);
    assert_eq!(
        second.usage.map(|u| u.completion_tokens),
        Some(1),
        "and the winner's tokens"
    );
}

async fn different_question_is_fatal(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    h.register(&["nondeterministic-prompt"]).await;
    let run = h
        .submit(
            &ratchet_tests::one_stage_pipeline("ask", "nondeterministic-prompt", ""),
            b"",
        )
        .await;
    let sched = h.scheduler("worker", 30_000);
    let first = sched.claim(None).await.expect("claim").expect("ready");
    let outcome = sched.run_claimed(first).await.expect("attempt 1").outcome;
    let AttemptOutcome::Retrying { at, .. } = outcome else {
        panic!("attempt 1 fails retryably: {outcome:?}");
    };

    let journal = h.store.model_call_list(&run).await.expect("journal");
    assert_eq!(journal.len(), 1);
    let recorded = journal[0].request_digest.clone();

    clock.set(at);
    let retry = sched
        .claim(None)
        .await
        .expect("claim")
        .expect("the retry is due");
    let outcome = sched.run_claimed(retry).await.expect("attempt 2").outcome;
    let AttemptOutcome::Dead { error } = outcome else {
        panic!("non-determinism must be fatal: {outcome:?}");
    };
    assert!(error.contains("non-determinism"), "{error}");
    assert!(
        error.contains(&recorded),
        "the error names the recorded request digest: {error}"
    );
    assert_eq!(
        h.store.model_call_list(&run).await.expect("journal").len(),
        1
    );
    assert_eq!(h.run_state(&run).await, "failed");
}
