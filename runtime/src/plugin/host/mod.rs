//! Host side of the plugin's imports. Each capability is its own module; a
//! capability not granted to the attempt answers `access-denied`.

mod log;
mod model;

use std::sync::Arc;

use wasmtime_wasi::{WasiCtxView, WasiView};

use super::{ExecReport, HostState, Invocation};
use crate::clock::Clock;
use crate::model::ModelBackend;
use crate::store::Store;

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

/// The capabilities an attempt may use (manifest asks, policy grants).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Grants {
    pub log: bool,
    pub model: bool,
}

/// Per-attempt state behind the imports.
pub(crate) struct CallContext {
    store: Arc<dyn Store>,
    model: Arc<dyn ModelBackend>,
    clock: Arc<dyn Clock>,
    inv: Invocation,
    grants: Grants,
    next_model_call: i64,
    host_calls: u64,
    max_host_calls: u64,
    replayed: u32,
    fresh: u32,
    pub failure: Option<HostFailure>,
}

impl CallContext {
    pub fn new(
        store: Arc<dyn Store>,
        model: Arc<dyn ModelBackend>,
        clock: Arc<dyn Clock>,
        inv: Invocation,
        grants: Grants,
        max_host_calls: u64,
    ) -> Self {
        Self {
            store,
            model,
            clock,
            inv,
            grants,
            next_model_call: 0,
            host_calls: 0,
            max_host_calls,
            replayed: 0,
            fresh: 0,
            failure: None,
        }
    }

    pub fn report(&self) -> ExecReport {
        ExecReport {
            model_calls_replayed: self.replayed,
            model_calls_fresh: self.fresh,
        }
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

impl super::ratchet::stage::types::Host for HostState {}
