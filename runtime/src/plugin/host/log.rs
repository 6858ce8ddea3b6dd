//! `log`: lines go to the host's tracing output, tagged with run and stage,
//! their control characters escaped and their length bounded. `log` returns
//! nothing, so a call the attempt is not granted is dropped and counted.

use super::super::world::{v0_1, v0_2};
use super::super::{ExecReport, HostState, Invocation};

/// A line's level, in neither contract's types.
#[derive(Debug, Clone, Copy)]
enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Longest message kept; the rest is cut so a plugin cannot flood the log.
const MAX_MESSAGE: usize = 4096;

/// The `log` capability of one attempt.
pub(super) struct LogCapability {
    granted: bool,
    dropped: u32,
}

impl LogCapability {
    pub fn new(granted: bool) -> Self {
        Self {
            granted,
            dropped: 0,
        }
    }

    /// Writes the line, or drops and counts it when not granted.
    fn write(&mut self, inv: &Invocation, level: Level, message: &str) {
        if !self.granted {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        emit((&inv.run_id, &inv.stage), level, message);
    }

    pub fn report(&self, report: &mut ExecReport) {
        report.log_lines_dropped = self.dropped;
    }
}

/// A plugin's line reaches a terminal: no escape sequences, no NULs.
fn emit((run, stage): (&str, &str), level: Level, message: &str) {
    let message = crate::text::bounded(message, MAX_MESSAGE);
    match level {
        Level::Trace => tracing::trace!(run, stage, "{message}"),
        Level::Debug => tracing::debug!(run, stage, "{message}"),
        Level::Info => tracing::info!(run, stage, "{message}"),
        Level::Warn => tracing::warn!(run, stage, "{message}"),
        Level::Error => tracing::error!(run, stage, "{message}"),
    }
}

impl HostState {
    fn log_line(&mut self, level: Level, message: &str) -> wasmtime::Result<()> {
        match self.call.as_mut() {
            Some(call) => {
                call.count_call()?;
                call.log.write(&call.inv, level, message);
            }
            // `describe`: no attempt to tag the line with.
            None => emit(("-", "-"), level, message),
        }
        Ok(())
    }
}

/// Either contract's `log`, whose levels differ only in their type.
macro_rules! log_host {
    ($v:ident) => {
        impl $v::ratchet::stage::log::Host for HostState {
            async fn log(
                &mut self,
                level: $v::ratchet::stage::log::Level,
                message: String,
            ) -> wasmtime::Result<()> {
                use $v::ratchet::stage::log::Level as Wit;
                let level = match level {
                    Wit::Trace => Level::Trace,
                    Wit::Debug => Level::Debug,
                    Wit::Info => Level::Info,
                    Wit::Warn => Level::Warn,
                    Wit::Error => Level::Error,
                };
                self.log_line(level, &message)
            }
        }
    };
}

log_host!(v0_1);
log_host!(v0_2);

#[cfg(test)]
mod tests {
    use super::*;

    fn invocation() -> Invocation {
        Invocation {
            run_id: "r".into(),
            stage: "s".into(),
            attempt: 1,
            idempotency_key: "r/s".into(),
            started_at_ms: 0,
        }
    }

    /// A denied line is counted, a granted one is not. Seen failing with
    /// `write` returning early before counting.
    #[test]
    fn a_denied_line_is_dropped_and_counted() {
        let mut denied = LogCapability::new(false);
        let mut granted = LogCapability::new(true);
        for _ in 0..3 {
            denied.write(&invocation(), Level::Info, "hello");
            granted.write(&invocation(), Level::Info, "hello");
        }
        let (mut d, mut g) = (ExecReport::default(), ExecReport::default());
        denied.report(&mut d);
        granted.report(&mut g);
        assert_eq!(d.log_lines_dropped, 3);
        assert_eq!(g.log_lines_dropped, 0);
    }
}
