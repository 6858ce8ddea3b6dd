//! What runs an attempt: [`StageExecutor`], which the Wasm host
//! implements.

use crate::plugin::{ExecError, ExecReport, Invocation, Payload, PluginError, PluginHost};
use crate::store::StoreError;

/// What runs one attempt of a stage: the Wasm host ([`PluginHost`]), or
/// any other implementation (`ratchet bench` runs native Rust to measure
/// what Wasm costs).
#[async_trait::async_trait]
pub trait StageExecutor: Send + Sync {
    /// Runs the plugin pinned as `digest` on canonical `inputs`. An error
    /// only when the plugin could not be read (a store fault, retried);
    /// whatever the plugin does is the attempt's result.
    async fn run(
        &self,
        digest: &str,
        inv: &Invocation,
        inputs: Vec<Payload>,
    ) -> Result<(Result<Vec<Payload>, ExecError>, ExecReport), StoreError>;
    /// The longest an attempt may run (ms): leases are renewed that long at
    /// most.
    fn longest_attempt_ms(&self) -> u64;
}

#[async_trait::async_trait]
impl StageExecutor for PluginHost {
    async fn run(
        &self,
        digest: &str,
        inv: &Invocation,
        inputs: Vec<Payload>,
    ) -> Result<(Result<Vec<Payload>, ExecError>, ExecReport), StoreError> {
        let plugin = match self.load(digest).await {
            Ok(plugin) => plugin,
            Err(PluginError::Store(e)) => return Err(e),
            Err(e) => {
                let error = ExecError::Fatal(format!("cannot load the stage's plugin: {e}"));
                return Ok((Err(error), ExecReport::default()));
            }
        };
        let (result, mut report) = match self.execute(&plugin, inv, inputs).await {
            Ok((outputs, report)) => (Ok(outputs), report),
            Err((error, report)) => (Err(error), report),
        };
        report.plugin.clone_from(&plugin.manifest.name);
        Ok((result, report))
    }

    /// The operator's `timeout_ms` cap.
    fn longest_attempt_ms(&self) -> u64 {
        self.policy().caps.timeout_ms
    }
}
