//! Run a stage natively, with no database and no Wasm, the way the runtime
//! would across attempts: the model journal replays earlier answers to a
//! retry, a crash loses an attempt's proposal but not its journaled answers,
//! the manifest's output contract and capabilities are enforced, and the
//! first sound proposal is what gets committed.
//!
//! ```
//! use ratchet_plugin_sdk::testing::Harness;
//! use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage};
//!
//! struct Draft;
//! impl Stage for Draft {
//!     const MANIFEST: &'static str =
//!         "name = \"draft\"\nversion = \"1.0.0\"\ninputs = [\"topic\"]\noutputs = [\"draft\"]\ncapabilities = [\"model\"]";
//!     fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
//!         let answer = ctx.generate(&format!("Announce {}", inputs.text("topic")?))?;
//!         Ok(Outputs::new().text("draft", answer))
//!     }
//! }
//!
//! // Every attempt gets a different answer from the model, and the process
//! // dies after the first attempt, before its commit.
//! let report = Harness::<Draft>::new()
//!     .input_text("topic", "Ratchet")
//!     .model(|attempt, _prompt| Ok(format!("answer of attempt {attempt}")))
//!     .crash_after_attempt(1)
//!     .run();
//! // The retry was handed the journaled answer, so the committed draft is
//! // the first attempt's.
//! assert_eq!(report.text("draft"), "answer of attempt 1");
//! assert_eq!(report.attempts.len(), 2);
//! ```

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::bindings::ratchet::stage::model::{Answer, FinishReason, Request, ResponseFormat, Role};
use crate::bindings::ratchet::stage::types;
use crate::{Context, Error, HttpRequest, HttpResponse, Inputs, Level, ModelError, Stage};

/// The simulated wall clock unless [`Harness::clock`] sets another:
/// 2026-01-01T00:00:00Z.
pub const DEFAULT_CLOCK: Duration = Duration::from_secs(1_767_225_600);

type ModelFn = Box<dyn FnMut(u32, &str) -> Result<String, ModelError>>;
type HttpFn = Box<dyn FnMut(u32, &HttpRequest) -> Result<HttpResponse, Error>>;

/// What the runtime reads from a manifest; the rest is checked at
/// registration.
#[derive(Deserialize)]
struct Manifest {
    #[serde(default)]
    outputs: Vec<String>,
    #[serde(default)]
    capabilities: Vec<String>,
}

/// One stage, its inputs, the model it talks to, and where crashes happen.
pub struct Harness<S: Stage> {
    inputs: Vec<types::Artifact>,
    model: ModelFn,
    http: HttpFn,
    clock: SystemTime,
    crash_after: BTreeSet<u32>,
    max_attempts: u32,
    _stage: PhantomData<S>,
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its proposal was committed: these are the stage's artifacts.
    Committed,
    /// The process died after the attempt ran, before its commit.
    Crashed,
    /// It failed; `retryable` says whether the runtime tries again.
    Failed(Error),
}

/// An HTTP request as the attempt saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    pub request: HttpRequest,
    pub response: Result<HttpResponse, Error>,
    /// Answered from the journal of an earlier attempt.
    pub replayed: bool,
}

/// What the simulated journal holds at a call index (model calls and HTTP
/// requests share it, as in the runtime).
enum Recorded {
    Answer(String),
    Http(HttpResponse),
}

/// A model call as the attempt saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCall {
    pub prompt: String,
    pub answer: Result<String, String>,
    /// Answered from the journal of an earlier attempt.
    pub replayed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub number: u32,
    pub outcome: Outcome,
    pub model_calls: Vec<ModelCall>,
    pub http_calls: Vec<HttpCall>,
    pub logs: Vec<(Level, String)>,
}

/// Everything the simulated runtime did, and what it committed.
#[derive(Debug, Clone)]
pub struct Report {
    pub attempts: Vec<Attempt>,
    /// The committed artifacts (name, media type, bytes), if any attempt
    /// committed.
    pub committed: Option<Vec<(String, String, Vec<u8>)>>,
}

impl Report {
    /// The committed artifact `name`; panics with the attempts when none.
    pub fn bytes(&self, name: &str) -> &[u8] {
        self.committed
            .iter()
            .flatten()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, b)| b.as_slice())
            .unwrap_or_else(|| {
                panic!(
                    "no committed artifact `{name}`; attempts: {:#?}",
                    self.attempts
                )
            })
    }

    pub fn text(&self, name: &str) -> &str {
        std::str::from_utf8(self.bytes(name)).expect("artifact is UTF-8")
    }

    pub fn json<T: serde::de::DeserializeOwned>(&self, name: &str) -> T {
        serde_json::from_slice(self.bytes(name)).expect("artifact is the expected JSON")
    }

    /// The error that ended the stage, when nothing was committed.
    pub fn failure(&self) -> Option<&Error> {
        match self.attempts.last().map(|a| &a.outcome) {
            Some(Outcome::Failed(e)) if self.committed.is_none() => Some(e),
            _ => None,
        }
    }
}

impl<S: Stage> Default for Harness<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Stage> Harness<S> {
    /// Five attempts at most, no crashes, and a model whose answer names the
    /// attempt and the call, so an answer that was not replayed shows.
    pub fn new() -> Self {
        Self {
            inputs: Vec::new(),
            model: Box::new(|attempt, prompt| Ok(format!("answer {attempt}: {prompt}"))),
            http: Box::new(|_, request| {
                Err(Error::fatal(format!(
                    "no recorded reply for {} {} (give one with Harness::http_reply)",
                    request.method, request.url
                )))
            }),
            clock: SystemTime::UNIX_EPOCH + DEFAULT_CLOCK,
            crash_after: BTreeSet::new(),
            max_attempts: 5,
            _stage: PhantomData,
        }
    }

    pub fn input(mut self, name: &str, media_type: &str, bytes: impl Into<Vec<u8>>) -> Self {
        self.inputs.push(types::Artifact {
            name: name.to_string(),
            media_type: media_type.to_string(),
            bytes: bytes.into(),
        });
        self
    }

    pub fn input_text(self, name: &str, text: &str) -> Self {
        self.input(name, "text/plain; charset=utf-8", text)
    }

    pub fn input_json<T: serde::Serialize>(self, name: &str, value: &T) -> Self {
        let bytes = serde_json::to_vec(value).expect("input encodes as JSON");
        self.input(name, "application/json", bytes)
    }

    /// The model backend: called with the attempt number and the prompt
    /// (the last user message) whenever the journal has no answer yet. A
    /// request for JSON gets its answer checked against the request's
    /// schema, as the host does: one that does not fit fails the attempt,
    /// retryably, and is not journaled.
    pub fn model(
        mut self,
        answer: impl FnMut(u32, &str) -> Result<String, ModelError> + 'static,
    ) -> Self {
        self.model = Box::new(answer);
        self
    }

    /// The HTTP servers: called with the attempt number and the request
    /// whenever the journal has no response yet at its call index.
    pub fn http(
        mut self,
        server: impl FnMut(u32, &HttpRequest) -> Result<HttpResponse, Error> + 'static,
    ) -> Self {
        self.http = Box::new(server);
        self
    }

    /// A recorded reply to `method url`; other requests keep the earlier
    /// replies (or fail, when none matches).
    pub fn http_reply(mut self, method: &str, url: &str, response: HttpResponse) -> Self {
        let mut earlier = std::mem::replace(&mut self.http, Box::new(|_, _| unreachable!()));
        let (method, url) = (method.to_string(), url.to_string());
        self.http = Box::new(move |attempt, request| {
            if request.method.eq_ignore_ascii_case(&method) && request.url == url {
                Ok(response.clone())
            } else {
                earlier(attempt, request)
            }
        });
        self
    }

    /// What [`Context::now`] reads on every attempt (default
    /// [`DEFAULT_CLOCK`]): the host starts each attempt's clock where the
    /// first attempt's started.
    pub fn clock(mut self, now: SystemTime) -> Self {
        self.clock = now;
        self
    }

    /// The process dies after attempt `attempt` runs, before its commit.
    pub fn crash_after_attempt(mut self, attempt: u32) -> Self {
        self.crash_after.insert(attempt);
        self
    }

    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Runs attempts until one commits, one fails fatally, or none remain.
    pub fn run(self) -> Report {
        let manifest: Manifest = toml::from_str(S::MANIFEST)
            .unwrap_or_else(|e| panic!("the stage's MANIFEST is not valid TOML: {e}"));
        let inputs = Inputs {
            by_name: self
                .inputs
                .iter()
                .map(|a| (a.name.clone(), a.clone()))
                .collect(),
        };
        let sim = Rc::new(RefCell::new(SimHost {
            model: self.model,
            http: self.http,
            clock: self.clock,
            draws: 0,
            journal: Vec::new(),
            grant_model: manifest.capabilities.iter().any(|c| c == "model"),
            grant_log: manifest.capabilities.iter().any(|c| c == "log"),
            grant_http: manifest.capabilities.iter().any(|c| c == "http"),
            attempt: 0,
            next_call: 0,
            calls: Vec::new(),
            http_calls: Vec::new(),
            logs: Vec::new(),
            host_failure: None,
        }));
        let mut report = Report {
            attempts: Vec::new(),
            committed: None,
        };
        for number in 1..=self.max_attempts {
            sim.borrow_mut().begin(number);
            let ctx = Context {
                inner: types::StageContext {
                    run_id: "test-run".into(),
                    stage: "test-stage".into(),
                    attempt: number,
                    idempotency_key: "test-run/test-stage".into(),
                },
                sim: Some(sim.clone()),
            };
            let result = S::run(&ctx, &inputs);
            let (model_calls, http_calls, logs, host_failure) = sim.borrow_mut().end();
            let outcome = match (host_failure, result) {
                (Some(failure), _) => Outcome::Failed(failure),
                (None, Err(e)) => Outcome::Failed(e),
                (None, Ok(outputs)) => match check_outputs(&manifest, &outputs.artifacts) {
                    Err(e) => Outcome::Failed(e),
                    Ok(()) if self.crash_after.contains(&number) => Outcome::Crashed,
                    Ok(()) => {
                        report.committed = Some(
                            outputs
                                .artifacts
                                .into_iter()
                                .map(|a| (a.name, a.media_type, a.bytes))
                                .collect(),
                        );
                        Outcome::Committed
                    }
                },
            };
            let done = match &outcome {
                Outcome::Committed => true,
                Outcome::Crashed => false,
                Outcome::Failed(e) => !e.retryable,
            };
            report.attempts.push(Attempt {
                number,
                outcome,
                model_calls,
                http_calls,
                logs,
            });
            if done {
                break;
            }
        }
        report
    }
}

/// The contract the runtime enforces on a proposal.
fn check_outputs(manifest: &Manifest, outputs: &[types::Artifact]) -> Result<(), Error> {
    let mut seen = BTreeSet::new();
    for o in outputs {
        if !manifest.outputs.contains(&o.name) {
            return Err(Error::fatal(format!("output `{}` is not declared", o.name)));
        }
        if !seen.insert(o.name.as_str()) {
            return Err(Error::fatal(format!(
                "output `{}` was returned twice",
                o.name
            )));
        }
    }
    match manifest.outputs.iter().find(|n| !seen.contains(n.as_str())) {
        Some(missing) => Err(Error::fatal(format!(
            "declared output `{missing}` was not returned"
        ))),
        None => Ok(()),
    }
}

/// The host side of a simulated attempt.
#[doc(hidden)]
pub struct SimHost {
    model: ModelFn,
    http: HttpFn,
    clock: SystemTime,
    /// Random numbers drawn in this attempt.
    draws: u64,
    /// (request, answer) by call index: what the runtime journals.
    journal: Vec<(String, Recorded)>,
    grant_model: bool,
    grant_log: bool,
    grant_http: bool,
    attempt: u32,
    next_call: usize,
    calls: Vec<ModelCall>,
    http_calls: Vec<HttpCall>,
    logs: Vec<(Level, String)>,
    /// A failure the stage cannot swallow (non-determinism, an unavailable
    /// backend), as in the runtime.
    host_failure: Option<Error>,
}

impl SimHost {
    fn begin(&mut self, attempt: u32) {
        self.attempt = attempt;
        self.next_call = 0;
        self.draws = 0;
    }

    pub(crate) fn now(&self) -> SystemTime {
        self.clock
    }

    /// The same numbers on every attempt, like the host's generator
    /// seeded by run and stage (SplitMix64 over the draw count).
    pub(crate) fn random_u64(&mut self) -> u64 {
        self.draws += 1;
        let mut z = self.draws.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[allow(clippy::type_complexity)]
    fn end(
        &mut self,
    ) -> (
        Vec<ModelCall>,
        Vec<HttpCall>,
        Vec<(Level, String)>,
        Option<Error>,
    ) {
        (
            std::mem::take(&mut self.calls),
            std::mem::take(&mut self.http_calls),
            std::mem::take(&mut self.logs),
            self.host_failure.take(),
        )
    }

    pub(crate) fn log(&mut self, level: Level, message: &str) {
        if self.grant_log {
            self.logs.push((level, message.to_string()));
        }
    }

    pub(crate) fn generate(&mut self, request: &Request) -> Result<Answer, ModelError> {
        let prompt = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map_or("", |m| m.content.as_str());
        let key = format!("{request:?}");
        let result = self.answer(&key, prompt, request);
        let replayed = self.next_call < self.journal.len() && result.is_ok();
        self.calls.push(ModelCall {
            prompt: prompt.to_string(),
            answer: result.clone().map_err(|e| format!("{e:?}")),
            replayed,
        });
        if let (Ok(answer), false) = (&result, replayed) {
            self.journal.push((key, Recorded::Answer(answer.clone())));
        }
        self.next_call += 1;
        result.map(|text| Answer {
            text,
            finish_reason: FinishReason::Stop,
            model: "harness".into(),
            usage: None,
        })
    }

    fn answer(&mut self, key: &str, prompt: &str, request: &Request) -> Result<String, ModelError> {
        if !self.grant_model {
            return Err(ModelError::AccessDenied(
                "the manifest does not ask for the `model` capability".into(),
            ));
        }
        if let Some((recorded, answer)) = self.journal.get(self.next_call) {
            if let (Recorded::Answer(answer), true) = (answer, recorded == key) {
                return Ok(answer.clone());
            }
            let recorded = recorded.clone();
            return Err(ModelError::Rejected(self.non_determinism(key, &recorded)));
        }
        let answer = (self.model)(self.attempt, prompt);
        if let Err(ModelError::Unavailable(m)) = &answer {
            self.host_failure = Some(Error::retryable(format!("model unavailable: {m}")));
        }
        if let (Ok(text), ResponseFormat::Json(json)) = (&answer, &request.response_format)
            && let Err(why) = fits(&json.schema, text)
        {
            let message = format!("the answer does not fit the schema `{}`: {why}", json.name);
            self.host_failure = Some(Error::retryable(message.clone()));
            return Err(ModelError::Unavailable(message));
        }
        answer
    }
}

impl SimHost {
    /// Fails the attempt for good, as the host does when a retry asks
    /// something else at a journaled call index.
    fn non_determinism(&mut self, key: &str, recorded: &str) -> String {
        let message = format!(
            "non-determinism: call #{} asked {key} but an earlier attempt asked {recorded}",
            self.next_call
        );
        self.host_failure = Some(Error::fatal(message.clone()));
        message
    }

    pub(crate) fn http(&mut self, request: &HttpRequest) -> Result<HttpResponse, Error> {
        if !self.grant_http {
            return Err(Error::fatal(
                "the host denied the HTTP request: the manifest does not ask for the `http` capability",
            ));
        }
        let key = format!("{request:?}");
        let (response, replayed) = match self.journal.get(self.next_call) {
            Some((recorded, Recorded::Http(response))) if *recorded == key => {
                (Ok(response.clone()), true)
            }
            Some((recorded, _)) => {
                let recorded = recorded.clone();
                (
                    Err(Error::fatal(self.non_determinism(&key, &recorded))),
                    false,
                )
            }
            None => {
                let response = (self.http)(self.attempt, request);
                match &response {
                    Ok(r) => self.journal.push((key, Recorded::Http(r.clone()))),
                    // Not recorded, as in the runtime: the attempt fails and
                    // the retry asks again.
                    Err(e) if e.retryable => self.host_failure = Some(e.clone()),
                    Err(_) => {}
                }
                (response, false)
            }
        };
        self.http_calls.push(HttpCall {
            request: request.clone(),
            response: response.clone(),
            replayed,
        });
        self.next_call += 1;
        response
    }
}

/// Whether `answer` is JSON that fits `schema`, as the host checks it.
fn fits(schema: &str, answer: &str) -> Result<(), String> {
    let schema: serde_json::Value =
        serde_json::from_str(schema).map_err(|e| format!("the schema is not JSON: {e}"))?;
    let validator =
        jsonschema::validator_for(&schema).map_err(|e| format!("not a JSON Schema: {e}"))?;
    let value: serde_json::Value =
        serde_json::from_str(answer).map_err(|e| format!("the answer is not JSON: {e}"))?;
    match validator.iter_errors(&value).next() {
        None => Ok(()),
        Some(e) => Err(format!("at `{}`: {e}", e.instance_path())),
    }
}
