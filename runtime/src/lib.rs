//! Ratchet: a durable pipeline runtime whose stages are sandboxed WebAssembly
//! components. See README.md for the three invariants it keeps.

pub mod audit;
pub mod bundled;
pub mod client;
pub mod clock;
pub mod crash;
pub mod digest;
pub mod graph;
pub mod llm;
pub mod manifest;
pub mod metrics;
pub mod operator;
pub mod plugin;
pub mod registry;
pub mod relay;
pub mod scheduler;
pub mod store;
pub mod text;
pub mod worker;

/// Locks `m`, taking its value even if a panicking holder poisoned it: every
/// mutex of the crate guards data a panic cannot leave half-written (a
/// cache, the leases a scheduler holds).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
