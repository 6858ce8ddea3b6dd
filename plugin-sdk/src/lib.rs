//! Write a Ratchet stage plugin in Rust: implement [`Stage`], call
//! [`export_stage!`], build for `wasm32-wasip2`. The WIT bindings stay hidden.
//! [`testing`] runs a stage natively under simulated crashes and retries.
//!
//! The stage speaks contract `ratchet:stage@0.2.0`: chat models with
//! structured output ([`Chat`], [`Context::structured`]), and a clock and
//! random numbers that replay on a retry ([`Context::now`],
//! [`Context::random_u64`]), and journaled HTTP to allow-listed hosts
//! ([`Context::http`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

mod chat;
mod http;

pub use chat::{Chat, Reply};
pub use http::{HttpRequest, HttpResponse};

#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

#[doc(hidden)]
#[allow(clippy::too_many_arguments)] // generated code
pub mod bindings {
    wit_bindgen::generate!({
        world: "stage",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_stage_world",
        default_bindings_module: "::ratchet_plugin_sdk::bindings",
        additional_derives: [PartialEq],
    });
}

pub use bindings::ratchet::stage::log::Level;
pub use bindings::ratchet::stage::model::{FinishReason, ModelError, Role, Usage};
use bindings::ratchet::stage::types;

/// A stage: a manifest and one function from canonical inputs to proposed
/// outputs. The host may call `run` more than once for the same stage of the
/// same run (retries); only the first committed proposal is kept.
pub trait Stage {
    /// The plugin manifest, as TOML; usually `include_str!("../plugin.toml")`.
    const MANIFEST: &'static str;

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error>;
}

/// Exports a [`Stage`] implementation as this component's `stage` world.
#[macro_export]
macro_rules! export_stage {
    ($stage:ty) => {
        struct __RatchetStageExport;
        impl $crate::bindings::Guest for __RatchetStageExport {
            fn describe() -> ::std::string::String {
                <$stage as $crate::Stage>::MANIFEST.to_string()
            }
            fn run(
                ctx: $crate::bindings::StageContext,
                inputs: ::std::vec::Vec<$crate::bindings::Artifact>,
            ) -> ::std::result::Result<
                ::std::vec::Vec<$crate::bindings::Artifact>,
                $crate::bindings::StageError,
            > {
                $crate::__run::<$stage>(ctx, inputs)
            }
        }
        $crate::bindings::__export_stage_world!(__RatchetStageExport);
    };
}

#[doc(hidden)]
pub fn __run<S: Stage>(
    ctx: types::StageContext,
    inputs: Vec<types::Artifact>,
) -> Result<Vec<types::Artifact>, types::StageError> {
    let ctx = Context {
        inner: ctx,
        #[cfg(not(target_arch = "wasm32"))]
        sim: None,
    };
    let inputs = Inputs {
        by_name: inputs.into_iter().map(|a| (a.name.clone(), a)).collect(),
    };
    match S::run(&ctx, &inputs) {
        Ok(outputs) => Ok(outputs.artifacts),
        Err(Error {
            retryable: true,
            message,
        }) => Err(types::StageError::Retryable(message)),
        Err(Error {
            retryable: false,
            message,
        }) => Err(types::StageError::Fatal(message)),
    }
}

/// Identity of the attempt being run, and the host's capabilities.
pub struct Context {
    inner: types::StageContext,
    /// The simulated host of [`testing`], when run natively.
    #[cfg(not(target_arch = "wasm32"))]
    sim: Option<std::rc::Rc<std::cell::RefCell<testing::SimHost>>>,
}

impl Context {
    pub fn run_id(&self) -> &str {
        &self.inner.run_id
    }
    pub fn stage(&self) -> &str {
        &self.inner.stage
    }
    /// 1 for the first attempt.
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }
    /// The same for every attempt of this stage in this run: hand it to
    /// external systems so that a retried side effect is applied once.
    pub fn idempotency_key(&self) -> &str {
        &self.inner.idempotency_key
    }
    pub fn log(&self, level: Level, message: &str) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(sim) = &self.sim {
            return sim.borrow_mut().log(level, message);
        }
        bindings::ratchet::stage::log::log(level, message);
    }
    pub fn info(&self, message: &str) {
        self.log(Level::Info, message);
    }
    /// Asks the model one prompt (one user message) and returns the text.
    /// The host journals the answer before returning it: a retried attempt
    /// gets the answers earlier attempts got, call by call.
    pub fn generate(&self, prompt: &str) -> Result<String, Error> {
        Ok(self.chat(&Chat::new().user(prompt))?.text)
    }

    /// Asks the model a chat, journaled like [`Context::generate`].
    pub fn chat(&self, chat: &Chat) -> Result<Reply, Error> {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(sim) = &self.sim {
            return sim
                .borrow_mut()
                .generate(chat.request())
                .map(Reply::from)
                .map_err(Error::from);
        }
        bindings::ratchet::stage::model::generate(chat.request())
            .map(Reply::from)
            .map_err(Error::from)
    }

    /// Asks for an answer of type `T`: the request carries `T`'s JSON
    /// Schema, the host hands over only an answer that fits it (one that
    /// does not fails the attempt, retryably), and it is decoded here.
    pub fn structured<T>(&self, chat: &Chat) -> Result<T, Error>
    where
        T: serde::de::DeserializeOwned + schemars::JsonSchema,
    {
        let name = T::schema_name();
        let schema = serde_json::to_value(schemars::schema_for!(T))
            .map_err(|e| Error::fatal(format!("the schema of `{name}` cannot be encoded: {e}")))?;
        let answer = self.structured_value(chat, &name, &schema)?;
        serde_json::from_value(answer).map_err(|e| {
            Error::fatal(format!(
                "an answer that fits the schema of `{name}` does not decode as it: {e}"
            ))
        })
    }

    /// Asks for one JSON value that fits `schema` (a JSON Schema), checked
    /// by the host.
    pub fn structured_value(
        &self,
        chat: &Chat,
        name: &str,
        schema: &serde_json::Value,
    ) -> Result<serde_json::Value, Error> {
        let reply = self.chat(&chat.clone().json_schema(name, schema))?;
        serde_json::from_str(&reply.text)
            .map_err(|e| Error::fatal(format!("the answer for `{name}` is not JSON: {e}")))
    }

    /// Sends an HTTP request through the host and waits for the whole
    /// response. The manifest asks for `http` and lists the host in
    /// `allowed_hosts`; the host journals the response, so a retry is
    /// handed the recorded one and the server is asked once. A request the
    /// host denies fails fatally; one the network fails, retryably.
    pub fn http(&self, request: &HttpRequest) -> Result<HttpResponse, Error> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            match &self.sim {
                Some(sim) => sim.borrow_mut().http(request),
                None => Err(Error::fatal(
                    "HTTP needs the host: run the stage as a component, or natively under testing::Harness",
                )),
            }
        }
        #[cfg(target_arch = "wasm32")]
        http::send(request)
    }

    /// The wall clock. It starts where the stage's first attempt started
    /// and runs on, so every attempt sees the same date: a date put into a
    /// prompt replays on a retry.
    pub fn now(&self) -> SystemTime {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(sim) = &self.sim {
            return sim.borrow().now();
        }
        SystemTime::now()
    }

    /// A random number. The host seeds the stage's generator with the run
    /// and the stage, so every attempt draws the same numbers in the same
    /// order: a random pick replays on a retry. Predictable by design: not
    /// for secrets.
    pub fn random_u64(&self) -> u64 {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(sim) = &self.sim {
            return sim.borrow_mut().random_u64();
        }
        #[cfg(target_arch = "wasm32")]
        {
            // WASI's random interface cannot fail.
            getrandom::u64().unwrap_or_default()
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(0u8)
        }
    }
}

/// The canonical inputs of this attempt, by input name.
pub struct Inputs {
    by_name: BTreeMap<String, types::Artifact>,
}

impl Inputs {
    pub fn bytes(&self, name: &str) -> Result<&[u8], Error> {
        self.by_name
            .get(name)
            .map(|a| a.bytes.as_slice())
            .ok_or_else(|| Error::fatal(format!("input `{name}` was not provided")))
    }
    pub fn text(&self, name: &str) -> Result<&str, Error> {
        std::str::from_utf8(self.bytes(name)?)
            .map_err(|e| Error::fatal(format!("input `{name}` is not UTF-8: {e}")))
    }
    pub fn json<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<T, Error> {
        serde_json::from_slice(self.bytes(name)?)
            .map_err(|e| Error::fatal(format!("input `{name}` is not the expected JSON: {e}")))
    }
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

/// The outputs an attempt proposes.
#[derive(Default)]
pub struct Outputs {
    artifacts: Vec<types::Artifact>,
}

impl Outputs {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn bytes(mut self, name: &str, media_type: &str, bytes: Vec<u8>) -> Self {
        self.artifacts.push(types::Artifact {
            name: name.to_string(),
            media_type: media_type.to_string(),
            bytes,
        });
        self
    }
    pub fn text(self, name: &str, text: impl Into<String>) -> Self {
        self.bytes(name, "text/plain; charset=utf-8", text.into().into_bytes())
    }
    pub fn json<T: serde::Serialize>(self, name: &str, value: &T) -> Result<Self, Error> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| Error::fatal(format!("output `{name}` cannot be encoded: {e}")))?;
        Ok(self.bytes(name, "application/json", bytes))
    }
}

/// A failed attempt: retryable (tried again with backoff) or fatal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub retryable: bool,
    pub message: String,
}

impl Error {
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            retryable: true,
            message: message.into(),
        }
    }
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            retryable: false,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.retryable { "retryable" } else { "fatal" };
        write!(f, "{kind}: {}", self.message)
    }
}

impl std::error::Error for Error {}

impl From<ModelError> for Error {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Unavailable(m) => Error::retryable(format!("model unavailable: {m}")),
            ModelError::AccessDenied(m) => Error::fatal(format!("model access denied: {m}")),
            ModelError::Rejected(m) => Error::fatal(format!("model rejected the call: {m}")),
        }
    }
}
