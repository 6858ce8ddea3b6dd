//! Ratchet: a durable pipeline runtime whose stages are sandboxed WebAssembly
//! components. See README.md for the three invariants it keeps.

pub mod audit;
pub mod bench;
pub mod bundled;
pub mod cli;
pub mod clock;
pub mod crash;
pub mod digest;
pub mod manifest;
pub mod model;
pub mod plugin;
pub mod registry;
pub mod scheduler;
pub mod store;
pub mod worker;
