//! `log`: lines go to the host's tracing output, tagged with run and stage,
//! their control characters escaped.
//! `log` returns nothing, so a denied call is counted and dropped.

use super::super::HostState;
use super::super::ratchet::stage::log::{Host, Level};

/// Longest message kept; the rest is cut so a plugin cannot flood the log.
const MAX_MESSAGE: usize = 4096;

impl Host for HostState {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        if let Some(call) = self.call.as_mut() {
            call.count_call()?;
            if !call.grants.log {
                return Ok(());
            }
        }
        // A plugin's line reaches a terminal: no escape sequences, no NULs.
        let message = crate::text::bounded(&message, MAX_MESSAGE);
        let (run, stage) = match &self.call {
            Some(c) => (c.inv.run_id.as_str(), c.inv.stage.as_str()),
            None => ("-", "-"),
        };
        match level {
            Level::Trace => tracing::trace!(run, stage, "{message}"),
            Level::Debug => tracing::debug!(run, stage, "{message}"),
            Level::Info => tracing::info!(run, stage, "{message}"),
            Level::Warn => tracing::warn!(run, stage, "{message}"),
            Level::Error => tracing::error!(run, stage, "{message}"),
        }
        Ok(())
    }
}
