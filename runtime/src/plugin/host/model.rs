//! `model.generate`: journaled canonical-first. The k-th call of a stage in a
//! run is answered from the journal when an earlier attempt recorded it, and
//! otherwise asked of the backend and recorded before the plugin sees it;
//! a backend's refusal is recorded and replayed the same way.

use super::super::ratchet::stage::model::{Host, ModelError, Request};
use super::super::{ExecReport, HostState, Invocation};
use super::{HostFailure, Services};
use crate::digest::sha256_hex;
use crate::llm::{ModelError as BackendError, ModelRequest, Usage};
use crate::store::{ModelCall, ModelCallPut, StoreError};

/// The `model` capability of one attempt.
pub(super) struct ModelCapability {
    /// `None` when the attempt is not granted the capability.
    granted: Option<Services>,
    next_call: i64,
    replayed: u32,
    fresh: u32,
    tokens: Usage,
}

/// A call the plugin gets an error for, and whether it also fails the
/// attempt whatever the plugin does with it.
#[derive(Debug)]
pub(super) struct Refusal {
    answer: ModelError,
    failure: Option<HostFailure>,
}

impl Refusal {
    fn answer(answer: ModelError) -> Self {
        Self {
            answer,
            failure: None,
        }
    }

    fn failing(answer: ModelError, failure: HostFailure) -> Self {
        Self {
            answer,
            failure: Some(failure),
        }
    }
}

impl ModelCapability {
    pub fn new(granted: bool, services: &Services) -> Self {
        Self {
            granted: granted.then(|| services.clone()),
            next_call: 0,
            replayed: 0,
            fresh: 0,
            tokens: Usage::default(),
        }
    }

    pub fn report(&self, report: &mut ExecReport) {
        report.model_calls_replayed = self.replayed;
        report.model_calls_fresh = self.fresh;
        report.model_tokens = self.tokens;
    }

    /// The answer to the attempt's next model call.
    async fn generate(
        &mut self,
        inv: &Invocation,
        request: ModelRequest,
    ) -> Result<String, Refusal> {
        let Some(services) = self.granted.clone() else {
            return Err(Refusal::answer(ModelError::AccessDenied(
                "the `model` capability is not granted: the manifest must ask for it and the operator's policy must grant it".into(),
            )));
        };
        let index = self.next_call;
        self.next_call += 1;
        let request_digest = sha256_hex(
            serde_json::to_string(&request)
                .unwrap_or_default()
                .as_bytes(),
        );
        let recorded = services
            .journal
            .model_call_get(&inv.run_id, &inv.stage, index)
            .await
            .map_err(journal_unavailable)?;
        let answer = match recorded {
            Some(recorded) => recorded,
            None => ask_and_journal(&services, inv, &request, index, &request_digest).await?,
        };
        if answer.attempt == inv.attempt {
            self.fresh += 1;
            self.tokens += answer.usage.unwrap_or_default();
        } else {
            self.replayed += 1;
        }
        if answer.request_digest != request_digest {
            let failure = HostFailure::NonDeterminism {
                index,
                recorded: answer.request_digest.clone(),
                now: request_digest,
            };
            return Err(Refusal::failing(
                ModelError::Rejected(failure.to_string()),
                failure,
            ));
        }
        crate::crash::point("after_model_call");
        if answer.rejected {
            return Err(Refusal::answer(ModelError::Rejected(answer.response)));
        }
        Ok(answer.response)
    }
}

/// Asks the backend, then journals canonical-first and returns the stored
/// row, not the fresh answer: a racing attempt may have recorded first.
async fn ask_and_journal(
    services: &Services,
    inv: &Invocation,
    request: &ModelRequest,
    index: i64,
    request_digest: &str,
) -> Result<ModelCall, Refusal> {
    // A refusal is journaled like an answer: it used this call index, and a
    // retry must meet it there, or its later calls would no longer line up
    // with the journal.
    let (response, rejected, usage) = match services.model.generate(request).await {
        Ok(answer) => (answer.text, false, answer.usage),
        Err(BackendError::Unavailable(m)) => {
            return Err(Refusal::failing(
                ModelError::Unavailable(m.clone()),
                HostFailure::Model(m),
            ));
        }
        Err(BackendError::Rejected(m)) => (m, true, None),
    };
    let put = ModelCallPut {
        run_id: inv.run_id.clone(),
        stage: inv.stage.clone(),
        index,
        request_digest: request_digest.to_string(),
        response,
        rejected,
        attempt: inv.attempt,
        now: services.clock.now_ms(),
        usage,
    };
    services
        .journal
        .model_call_put(put)
        .await
        .map_err(journal_unavailable)
}

/// The journal cannot be read or written: the plugin is told the model is
/// unavailable, and the attempt fails (and is retried) whatever it does.
fn journal_unavailable(e: StoreError) -> Refusal {
    Refusal::failing(
        ModelError::Unavailable("model journal unavailable".into()),
        HostFailure::Journal(e.to_string()),
    )
}

impl Host for HostState {
    async fn generate(&mut self, request: Request) -> wasmtime::Result<Result<String, ModelError>> {
        let Some(call) = self.call.as_mut() else {
            return Ok(Err(ModelError::AccessDenied(
                "no model during `describe`".into(),
            )));
        };
        call.count_call()?;
        let request = ModelRequest {
            prompt: request.prompt,
            max_tokens: request.max_tokens,
        };
        match call.model.generate(&call.inv, request).await {
            Ok(answer) => Ok(Ok(answer)),
            Err(Refusal { answer, failure }) => {
                if let Some(failure) = failure {
                    call.fail(failure);
                }
                Ok(Err(answer))
            }
        }
    }
}

/// The capability on its own, with a journal and a backend that stand in
/// for the store and a model server: no database, no Wasm guest.
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::clock::ManualClock;
    use crate::llm::{Answer, ModelBackend};
    use crate::store::{self, Journal};

    /// One stage's journal in memory, canonical-first like the store's.
    #[derive(Default)]
    struct MemoryJournal {
        calls: std::sync::Mutex<BTreeMap<i64, ModelCall>>,
        offline: AtomicBool,
    }

    impl MemoryJournal {
        fn check(&self) -> store::Result<()> {
            if self.offline.load(Ordering::SeqCst) {
                return Err(StoreError::Database(sqlx::Error::PoolTimedOut));
            }
            Ok(())
        }
    }

    #[async_trait]
    impl Journal for MemoryJournal {
        async fn model_call_put(&self, m: ModelCallPut) -> store::Result<ModelCall> {
            self.check()?;
            let mut calls = crate::lock(&self.calls);
            let stored = calls.entry(m.index).or_insert(ModelCall {
                run_id: m.run_id,
                stage: m.stage,
                index: m.index,
                request_digest: m.request_digest,
                response: m.response,
                rejected: m.rejected,
                attempt: m.attempt,
                usage: m.usage,
            });
            Ok(stored.clone())
        }

        async fn model_call_get(
            &self,
            _run_id: &str,
            _stage: &str,
            index: i64,
        ) -> store::Result<Option<ModelCall>> {
            self.check()?;
            Ok(crate::lock(&self.calls).get(&index).cloned())
        }
    }

    /// Answers `answer N` to its N-th question: never twice the same.
    #[derive(Default)]
    struct Counting(AtomicU32);

    #[async_trait]
    impl ModelBackend for Counting {
        fn name(&self) -> String {
            "counting".into()
        }

        async fn generate(&self, _: &ModelRequest) -> Result<Answer, BackendError> {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Answer::text(format!("answer {n}")))
        }
    }

    struct Rig {
        journal: Arc<MemoryJournal>,
        backend: Arc<Counting>,
        services: Services,
    }

    fn rig() -> Rig {
        let journal = Arc::new(MemoryJournal::default());
        let backend = Arc::new(Counting::default());
        let services = Services {
            journal: journal.clone(),
            model: backend.clone(),
            clock: Arc::new(ManualClock::new(0)),
        };
        Rig {
            journal,
            backend,
            services,
        }
    }

    fn attempt(n: i64) -> Invocation {
        Invocation {
            run_id: "run".into(),
            stage: "draft".into(),
            attempt: n,
            idempotency_key: "run/draft".into(),
        }
    }

    fn request(prompt: &str) -> ModelRequest {
        ModelRequest {
            prompt: prompt.into(),
            max_tokens: None,
        }
    }

    fn report(model: &ModelCapability) -> ExecReport {
        let mut report = ExecReport::default();
        model.report(&mut report);
        report
    }

    /// The local value trap at the capability: a retry gets the answer the
    /// first attempt recorded, and the backend is not asked again. Seen
    /// failing with the journal read skipped (the backend asked twice).
    #[tokio::test]
    async fn a_retry_replays_the_recorded_answer() {
        let rig = rig();
        let mut first = ModelCapability::new(true, &rig.services);
        let answer = first
            .generate(&attempt(1), request("p"))
            .await
            .expect("answer");
        let mut retry = ModelCapability::new(true, &rig.services);
        let replayed = retry
            .generate(&attempt(2), request("p"))
            .await
            .expect("replay");
        assert_eq!(
            (answer.as_str(), replayed.as_str()),
            ("answer 1", "answer 1")
        );
        assert_eq!(rig.backend.0.load(Ordering::SeqCst), 1, "asked once");
        assert_eq!(report(&first).model_calls_fresh, 1);
        assert_eq!(report(&retry).model_calls_replayed, 1);
    }

    /// A retry that asks another question where the journal recorded one
    /// fails the attempt for good. Seen failing with the digest check
    /// removed (the retry got the recorded answer to another question).
    #[tokio::test]
    async fn another_question_at_a_recorded_index_fails_the_attempt() {
        let rig = rig();
        let mut first = ModelCapability::new(true, &rig.services);
        first
            .generate(&attempt(1), request("p"))
            .await
            .expect("answer");
        let mut retry = ModelCapability::new(true, &rig.services);
        let refusal = retry
            .generate(&attempt(2), request("q"))
            .await
            .expect_err("refused");
        assert!(matches!(refusal.answer, ModelError::Rejected(_)));
        let failure = refusal.failure.expect("the attempt fails");
        assert!(matches!(
            failure,
            HostFailure::NonDeterminism { index: 0, .. }
        ));
        assert!(!failure.is_retryable());
    }

    /// A journal that cannot be read fails the attempt, retryably, and the
    /// backend is not asked (its answer could not be recorded). Seen failing
    /// with the read error treated as "nothing recorded".
    #[tokio::test]
    async fn an_unreachable_journal_fails_the_attempt() {
        let rig = rig();
        rig.journal.offline.store(true, Ordering::SeqCst);
        let mut model = ModelCapability::new(true, &rig.services);
        let refusal = model
            .generate(&attempt(1), request("p"))
            .await
            .expect_err("refused");
        assert!(matches!(refusal.answer, ModelError::Unavailable(_)));
        assert!(matches!(refusal.failure, Some(HostFailure::Journal(_))));
        assert!(refusal.failure.is_some_and(|f| f.is_retryable()));
        assert_eq!(rig.backend.0.load(Ordering::SeqCst), 0);
    }

    /// Not granted: `access-denied`, and neither the backend nor the journal
    /// is touched. Seen failing with the grant ignored.
    #[tokio::test]
    async fn a_denied_call_asks_nothing() {
        let rig = rig();
        let mut model = ModelCapability::new(false, &rig.services);
        let refusal = model
            .generate(&attempt(1), request("p"))
            .await
            .expect_err("refused");
        assert!(matches!(refusal.answer, ModelError::AccessDenied(_)));
        assert!(refusal.failure.is_none(), "the plugin decides what to do");
        assert_eq!(rig.backend.0.load(Ordering::SeqCst), 0);
        assert!(crate::lock(&rig.journal.calls).is_empty());
    }
}
