//! `log`: lines go to the host's tracing output, tagged with run and stage.
//! `log` returns nothing, so a denied call is counted and dropped.

use super::super::HostState;
use super::super::ratchet::stage::log::{Host, Level};

/// Longest message kept; the rest is cut so a plugin cannot flood the log.
const MAX_MESSAGE: usize = 4096;

impl Host for HostState {
    async fn log(&mut self, level: Level, mut message: String) -> wasmtime::Result<()> {
        if let Some(call) = self.call.as_mut() {
            call.count_call()?;
            if !call.grants.log {
                return Ok(());
            }
        }
        if message.len() > MAX_MESSAGE {
            let mut cut = MAX_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
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
