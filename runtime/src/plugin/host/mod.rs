//! Host side of the plugin's imports: one module per capability, each with
//! its own state and its own grant ([`Capability`]). [`CallContext`] holds
//! one of each for an attempt, and the host-call budget they share.
//!
//! Denial: a denied call of an interface that returns a result answers
//! `access-denied` (`model`); one of an interface that returns nothing
//! (`log`) is dropped and counted in the attempt's [`ExecReport`].
//!
//! Adding a capability: a variant of [`Capability`] (its name and WIT
//! import), a module here with its state and `Host` impl, and its field in
//! [`CallContext`].

mod log;
mod model;

use std::collections::BTreeSet;
use std::sync::Arc;

use wasmtime_wasi::{WasiCtxView, WasiView};

use super::{ExecReport, HostState, Invocation};
use crate::clock::Clock;
use crate::llm::ModelBackend;
use crate::manifest::Capability;
use crate::store::Journal;

/// A host-side reason to fail the attempt whatever the plugin returns: the
/// plugin cannot swallow it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostFailure {
    #[error(
        "non-determinism: model call #{index} asked request {now} but the journal recorded {recorded} for it; the stage must ask the same questions in the same order on every attempt"
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
}

/// Per-attempt state behind the imports.
pub(crate) struct CallContext {
    inv: Invocation,
    host_calls: u64,
    max_host_calls: u64,
    log: log::LogCapability,
    model: model::ModelCapability,
    pub failure: Option<HostFailure>,
}

impl CallContext {
    /// `granted` tells whether the attempt may use a capability.
    pub fn new(
        inv: Invocation,
        max_host_calls: u64,
        granted: impl Fn(Capability) -> bool,
        services: &Services,
    ) -> Self {
        Self {
            log: log::LogCapability::new(granted(Capability::Log)),
            model: model::ModelCapability::new(granted(Capability::Model), services),
            inv,
            host_calls: 0,
            max_host_calls,
            failure: None,
        }
    }

    pub fn invocation(&self) -> &Invocation {
        &self.inv
    }

    pub fn report(&self) -> ExecReport {
        let mut report = ExecReport::default();
        self.log.report(&mut report);
        self.model.report(&mut report);
        report
    }

    fn fail(&mut self, failure: HostFailure) {
        self.failure.get_or_insert(failure);
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

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
