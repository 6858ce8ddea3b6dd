//! `model.generate`: journaled canonical-first. The k-th call of a stage in a
//! run is answered from the journal when an earlier attempt recorded it, and
//! otherwise asked of the backend and recorded before the plugin sees it;
//! a backend's refusal is recorded and replayed the same way. An answer
//! that does not fit the request's schema is never recorded nor handed
//! over: the attempt fails, retryably, and the retry asks again.
//!
//! Both contracts reach [`ModelCapability::generate`]: 0.1.0 asks one
//! prompt, 0.2.0 a chat.

use super::super::world::{v0_1, v0_2};
use super::super::{ExecReport, HostState, Invocation};
use super::{HostFailure, Services};
use crate::llm::{
    FinishReason, Message, ModelError as BackendError, ModelRequest, ResponseFormat, Role, Schema,
    Usage,
};
use crate::store::{CallKind, ModelCall, ModelCallPut, StoreError};

/// The `model` capability of one attempt.
pub(super) struct ModelCapability {
    /// `None` when the attempt is not granted the capability.
    granted: Option<Services>,
    replayed: u32,
    fresh: u32,
    tokens: Usage,
}

/// Why a call got no answer, in neither contract's types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Denial {
    AccessDenied(String),
    Unavailable(String),
    Rejected(String),
}

/// A call the plugin gets an error for, and whether it also fails the
/// attempt whatever the plugin does with it.
#[derive(Debug)]
pub(super) struct Refusal {
    answer: Denial,
    failure: Option<HostFailure>,
}

impl Refusal {
    fn answer(answer: Denial) -> Self {
        Self {
            answer,
            failure: None,
        }
    }

    fn failing(answer: Denial, failure: HostFailure) -> Self {
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

    /// The journaled answer to the attempt's next model call; `next_call`
    /// is the index of the attempt's next call, model or HTTP.
    async fn generate(
        &mut self,
        inv: &Invocation,
        next_call: &mut i64,
        request: ModelRequest,
    ) -> Result<ModelCall, Refusal> {
        let Some(services) = self.granted.clone() else {
            return Err(Refusal::answer(Denial::AccessDenied(
                "the `model` capability is not granted: the manifest must ask for it and the operator's policy must grant it".into(),
            )));
        };
        if let Some(model) = &request.model
            && !services.allowed_models.contains(model)
        {
            return Err(Refusal::answer(Denial::AccessDenied(format!(
                "model `{}` is not allowed by the operator's policy (allowed: [{}]); ask for no model to get the default",
                crate::text::bounded(model, 64),
                services
                    .allowed_models
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))));
        }
        let index = *next_call;
        *next_call += 1;
        let request_digest = request.digest();
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
        if answer.kind != CallKind::Model || answer.request_digest != request_digest {
            let failure = HostFailure::NonDeterminism {
                index,
                recorded: answer.kind.request(&answer.request_digest),
                now: CallKind::Model.request(&request_digest),
            };
            return Err(Refusal::failing(
                Denial::Rejected(failure.to_string()),
                failure,
            ));
        }
        crate::crash::point("after_model_call");
        if answer.rejected {
            return Err(Refusal::answer(Denial::Rejected(answer.response)));
        }
        Ok(answer)
    }
}

/// Asks the backend, checks the answer against the request's schema, then
/// journals canonical-first and returns the stored row, not the fresh
/// answer: a racing attempt may have recorded first.
async fn ask_and_journal(
    services: &Services,
    inv: &Invocation,
    request: &ModelRequest,
    index: i64,
    request_digest: &str,
) -> Result<ModelCall, Refusal> {
    let unavailable =
        |m: String| Refusal::failing(Denial::Unavailable(m.clone()), HostFailure::Model(m));
    // A refusal is journaled like an answer: it used this call index, and a
    // retry must meet it there, or its later calls would no longer line up
    // with the journal.
    let (response, rejected, usage, finish_reason, model) =
        match services.model.generate(request).await {
            Ok(answer) => {
                if let ResponseFormat::Json { schema, .. } = &request.format {
                    schema.check(&answer.text).map_err(unavailable)?;
                }
                let model = answer.model.map(|m| crate::text::bounded(&m, 200));
                (
                    answer.text,
                    false,
                    answer.usage,
                    Some(answer.finish_reason),
                    model,
                )
            }
            Err(BackendError::Unavailable(m)) => return Err(unavailable(m)),
            Err(BackendError::Rejected(m)) => (m, true, None, None, None),
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
        finish_reason,
        model,
        kind: CallKind::Model,
        http: None,
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
        Denial::Unavailable("model journal unavailable".into()),
        HostFailure::Journal(e.to_string()),
    )
}

impl HostState {
    /// One model call from either contract: counted, answered, and a
    /// failure the plugin cannot swallow kept for the attempt.
    async fn model_call(
        &mut self,
        request: Result<ModelRequest, Denial>,
    ) -> wasmtime::Result<Result<ModelCall, Denial>> {
        let Some(call) = self.call.as_mut() else {
            return Ok(Err(Denial::AccessDenied(
                "no model during `describe`".into(),
            )));
        };
        call.count_call()?;
        let request = match request {
            Ok(request) => request,
            Err(denial) => return Ok(Err(denial)),
        };
        match call
            .model
            .generate(&call.inv, &mut call.next_call, request)
            .await
        {
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

/// [`Denial`] as either contract's `model-error`.
macro_rules! model_error {
    ($v:ident, $denial:expr) => {{
        use $v::ratchet::stage::model::ModelError;
        match $denial {
            Denial::AccessDenied(m) => ModelError::AccessDenied(m),
            Denial::Unavailable(m) => ModelError::Unavailable(m),
            Denial::Rejected(m) => ModelError::Rejected(m),
        }
    }};
}

impl v0_1::ratchet::stage::model::Host for HostState {
    async fn generate(
        &mut self,
        request: v0_1::ratchet::stage::model::Request,
    ) -> wasmtime::Result<Result<String, v0_1::ratchet::stage::model::ModelError>> {
        let request = ModelRequest::prompt(request.prompt, request.max_tokens);
        Ok(match self.model_call(Ok(request)).await? {
            Ok(answer) => Ok(answer.response),
            Err(denial) => Err(model_error!(v0_1, denial)),
        })
    }
}

impl v0_2::ratchet::stage::model::Host for HostState {
    async fn generate(
        &mut self,
        request: v0_2::ratchet::stage::model::Request,
    ) -> wasmtime::Result<
        Result<v0_2::ratchet::stage::model::Answer, v0_2::ratchet::stage::model::ModelError>,
    > {
        use v0_2::ratchet::stage::model as wit;
        let answer = self.model_call(chat_request(request)).await?;
        Ok(match answer {
            Ok(call) => Ok(wit::Answer {
                text: call.response,
                finish_reason: match call.finish_reason.unwrap_or_default() {
                    FinishReason::Stop => wit::FinishReason::Stop,
                    FinishReason::Length => wit::FinishReason::Length,
                    FinishReason::ContentFilter => wit::FinishReason::ContentFilter,
                    FinishReason::Other => wit::FinishReason::Other,
                },
                model: call.model.unwrap_or_default(),
                usage: call.usage.map(|u| wit::Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                }),
            }),
            Err(denial) => Err(model_error!(v0_2, denial)),
        })
    }
}

/// A 0.2.0 request in the host's terms; a schema that is not one is
/// refused before anything is asked or journaled.
fn chat_request(request: v0_2::ratchet::stage::model::Request) -> Result<ModelRequest, Denial> {
    use v0_2::ratchet::stage::model as wit;
    let format = match request.response_format {
        wit::ResponseFormat::Text => ResponseFormat::Text,
        wit::ResponseFormat::Json(json) => ResponseFormat::Json {
            schema: Schema::parse(&json.schema).map_err(|e| {
                Denial::Rejected(format!(
                    "response format `{}`: {e}",
                    crate::text::bounded(&json.name, 64)
                ))
            })?,
            name: json.name,
        },
    };
    Ok(ModelRequest {
        messages: request
            .messages
            .into_iter()
            .map(|m| Message {
                role: match m.role {
                    wit::Role::System => Role::System,
                    wit::Role::User => Role::User,
                    wit::Role::Assistant => Role::Assistant,
                },
                content: m.content,
            })
            .collect(),
        model: request.model,
        temperature: request.temperature,
        top_p: request.top_p,
        stop: request.stop,
        max_tokens: request.max_tokens,
        format,
    })
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
                finish_reason: m.finish_reason,
                model: m.model,
                kind: m.kind,
                http: m.http,
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
        let policy = crate::plugin::Policy::default().with_models(["small"]);
        let services = Services::new(
            journal.clone(),
            backend.clone(),
            Arc::new(ManualClock::new(0)),
            &policy,
        )
        .expect("an HTTP client");
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
            started_at_ms: 0,
        }
    }

    fn request(prompt: &str) -> ModelRequest {
        ModelRequest::prompt(prompt, None)
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
            .generate(&attempt(1), &mut 0, request("p"))
            .await
            .expect("answer");
        let mut retry = ModelCapability::new(true, &rig.services);
        let replayed = retry
            .generate(&attempt(2), &mut 0, request("p"))
            .await
            .expect("replay");
        assert_eq!(
            (answer.response.as_str(), replayed.response.as_str()),
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
            .generate(&attempt(1), &mut 0, request("p"))
            .await
            .expect("answer");
        let mut retry = ModelCapability::new(true, &rig.services);
        let refusal = retry
            .generate(&attempt(2), &mut 0, request("q"))
            .await
            .expect_err("refused");
        assert!(matches!(refusal.answer, Denial::Rejected(_)));
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
            .generate(&attempt(1), &mut 0, request("p"))
            .await
            .expect_err("refused");
        assert!(matches!(refusal.answer, Denial::Unavailable(_)));
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
            .generate(&attempt(1), &mut 0, request("p"))
            .await
            .expect_err("refused");
        assert!(matches!(refusal.answer, Denial::AccessDenied(_)));
        assert!(refusal.failure.is_none(), "the plugin decides what to do");
        assert_eq!(rig.backend.0.load(Ordering::SeqCst), 0);
        assert!(crate::lock(&rig.journal.calls).is_empty());
    }

    /// A schema request whose answer does not fit: the plugin is told the
    /// model is unavailable, the attempt fails retryably, and nothing is
    /// journaled, so the retry asks again. Seen failing with the check
    /// removed (the answer `answer 1` journaled and handed over).
    #[tokio::test]
    async fn an_answer_that_does_not_fit_its_schema_is_not_kept() {
        let rig = rig();
        let mut request = request("p");
        request.format = ResponseFormat::Json {
            name: "n".into(),
            schema: Schema::parse(r#"{"type": "integer"}"#).expect("schema"),
        };
        let mut model = ModelCapability::new(true, &rig.services);
        let refusal = model
            .generate(&attempt(1), &mut 0, request)
            .await
            .expect_err("refused");
        assert!(matches!(&refusal.answer, Denial::Unavailable(m) if m.contains("not JSON")));
        assert!(refusal.failure.is_some_and(|f| f.is_retryable()));
        assert!(crate::lock(&rig.journal.calls).is_empty());
    }

    /// A model the policy does not list is denied before anything is asked
    /// or journaled. Seen failing with the allow-list unchecked.
    #[tokio::test]
    async fn a_model_the_operator_does_not_allow_is_denied() {
        let rig = rig();
        let mut model = ModelCapability::new(true, &rig.services);
        let mut asked = request("p");
        asked.model = Some("huge".into());
        let refusal = model
            .generate(&attempt(1), &mut 0, asked.clone())
            .await
            .expect_err("denied");
        assert!(
            matches!(&refusal.answer, Denial::AccessDenied(m) if m.contains("allowed: [small]"))
        );
        assert!(refusal.failure.is_none());
        asked.model = Some("small".into());
        model
            .generate(&attempt(1), &mut 0, asked)
            .await
            .expect("allowed");
        assert_eq!(rig.backend.0.load(Ordering::SeqCst), 1);
    }
}
