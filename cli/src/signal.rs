//! How a worker learns to stop.

use anyhow::{Context, Result};

/// SIGTERM and Ctrl-C, with handlers installed when this returns (before the
/// worker says it started), so an early signal is never the default "die".
pub(super) fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    let ctrl_c = tokio::signal::ctrl_c();
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
    })
}
