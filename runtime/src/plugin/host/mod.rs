//! Host side of the plugin's imports: one module per capability, each with
//! its own state and its own grant ([`Capability`]). [`CallContext`] holds
//! one of each for an attempt, and the host-call budget they share.
//!
//! Denial: a denied call of an interface that returns a result answers
//! `access-denied` (`model`) or `HTTP-request-denied` (`http`); one of an
//! interface that returns nothing (`log`) is dropped and counted in the
//! attempt's [`ExecReport`].
//!
//! Model calls and HTTP requests share one call index per stage: the
//! journal is one sequence, and a retry must ask the same things in the
//! same order.
//!
//! Adding a capability: a variant of [`Capability`] (its name and WIT
//! import), a module here with its state and `Host` impl, and its field in
//! [`CallContext`].

mod http;
mod log;
mod model;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use wasmtime_wasi::{WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

pub(crate) use self::http::Secrets;
use super::{EffectiveLimits, ExecReport, HostState, Invocation, Policy};
use crate::clock::Clock;
use crate::llm::ModelBackend;
use crate::manifest::{Capability, HostPattern, PluginManifest};
use crate::store::Journal;

/// A host-side reason to fail the attempt whatever the plugin returns: the
/// plugin cannot swallow it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostFailure {
    #[error(
        "non-determinism: call #{index} asked {now}, but the journal recorded {recorded} there; the stage must ask the same questions (model calls and HTTP requests) in the same order on every attempt"
    )]
    NonDeterminism {
        index: i64,
        recorded: String,
        now: String,
    },
    #[error("the model journal could not be written: {0}")]
    Journal(String),
    #[error("the model backend failed: {0}")]
    Model(String),
    #[error("{0}")]
    Http(String),
    #[error("the stage made more than {0} host calls (raise limits.max_host_calls)")]
    TooManyHostCalls(u64),
}

impl HostFailure {
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            HostFailure::NonDeterminism { .. } | HostFailure::TooManyHostCalls(_)
        )
    }
}

/// What the capabilities are built from: the host's shared services.
#[derive(Clone)]
pub(crate) struct Services {
    pub journal: Arc<dyn Journal>,
    pub model: Arc<dyn ModelBackend>,
    pub clock: Arc<dyn Clock>,
    /// Models a stage may ask for by name (the policy's `[model] allowed`).
    pub allowed_models: Arc<BTreeSet<String>>,
    /// Hosts stages may send HTTP requests to (`[http] allowed_hosts`).
    pub http_hosts: Arc<[HostPattern]>,
    pub secrets: Arc<Secrets>,
    /// Sends stages' HTTP requests; follows no redirect.
    pub http_client: reqwest::Client,
}

impl Services {
    pub fn new(
        journal: Arc<dyn Journal>,
        model: Arc<dyn ModelBackend>,
        clock: Arc<dyn Clock>,
        policy: &Policy,
    ) -> reqwest::Result<Self> {
        let http_client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self {
            journal,
            model,
            clock,
            allowed_models: Arc::new(policy.models().clone()),
            http_hosts: policy.http_hosts().into(),
            secrets: Arc::new(Secrets::from_policy(policy)),
            http_client,
        })
    }
}

/// The failure an attempt ends with whatever the plugin returns, shared
/// with the HTTP exchanges it spawned.
#[derive(Clone, Default)]
pub(crate) struct FailureSlot(Arc<Mutex<Option<HostFailure>>>);

impl FailureSlot {
    /// Keeps the first failure.
    fn fail(&self, failure: HostFailure) {
        crate::lock(&self.0).get_or_insert(failure);
    }

    pub fn take(&self) -> Option<HostFailure> {
        crate::lock(&self.0).take()
    }
}

/// Per-attempt state behind the imports.
pub(crate) struct CallContext {
    inv: Invocation,
    host_calls: u64,
    max_host_calls: u64,
    /// The index of the attempt's next model call or HTTP request.
    next_call: i64,
    log: log::LogCapability,
    model: model::ModelCapability,
    http: http::HttpCapability,
    pub failure: FailureSlot,
}

impl CallContext {
    /// The capabilities of an attempt of a plugin with this manifest, under
    /// the operator's policy.
    pub fn new(
        inv: Invocation,
        manifest: &PluginManifest,
        limits: &EffectiveLimits,
        policy: &Policy,
        services: &Services,
    ) -> Self {
        let granted = |capability| policy.grants(manifest, capability);
        Self {
            log: log::LogCapability::new(granted(Capability::Log)),
            model: model::ModelCapability::new(granted(Capability::Model), services),
            http: http::HttpCapability::new(
                granted(Capability::Http),
                services,
                &manifest.name,
                &manifest.allowed_hosts,
                limits.max_http_response_bytes,
            ),
            inv,
            host_calls: 0,
            max_host_calls: limits.max_host_calls,
            next_call: 0,
            failure: FailureSlot::default(),
        }
    }

    pub fn invocation(&self) -> &Invocation {
        &self.inv
    }

    pub fn report(&self) -> ExecReport {
        let mut report = ExecReport::default();
        self.log.report(&mut report);
        self.model.report(&mut report);
        self.http.report(&mut report);
        report
    }

    fn fail(&mut self, failure: HostFailure) {
        self.failure.fail(failure);
    }

    /// Counts one host call; past the limit the attempt fails and the guest
    /// traps at once, so a flood costs at most `max_host_calls` calls.
    fn count_call(&mut self) -> wasmtime::Result<()> {
        self.host_calls += 1;
        if self.host_calls > self.max_host_calls {
            self.fail(HostFailure::TooManyHostCalls(self.max_host_calls));
            return Err(wasmtime::format_err!(
                "host call limit of {} exceeded",
                self.max_host_calls
            ));
        }
        Ok(())
    }
}

/// No HTTP outside an attempt (`describe`): every request is denied.
pub(crate) struct NoHttp;

impl WasiHttpHooks for NoHttp {
    fn send_request(
        &mut self,
        request: ::http::Request<wasmtime_wasi_http::WasiBody>,
        _: Option<wasmtime_wasi_http::RequestOptions>,
        _: http::Transfer,
    ) -> http::Sent {
        Box::new(http::deny(request))
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        let hooks: &mut dyn WasiHttpHooks = match self.call.as_mut() {
            Some(call) => call,
            None => &mut self.no_http,
        };
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
