//! Registering a component: insert, and when nothing was inserted tell an
//! identical registration (a no-op) from a version taken by other bytes.
//! The order is decided here once; each backend supplies the statements
//! ([`PluginPutTx`]).

use super::{PluginPut, PluginPutOutcome, Result, StoreError};

/// The statements of a registration, inside one open transaction.
pub(crate) trait PluginPutTx {
    /// Inserts the plugin unless its digest or its `(name, version)` is
    /// taken; returns whether it did.
    async fn plugin_insert(&mut self, p: &PluginPut) -> Result<bool>;
    /// The digest registered as `name@version`, if any.
    async fn digest_of(&mut self, name: &str, version: &str) -> Result<Option<String>>;
}

/// Registers the plugin (see [`super::Catalog::plugin_put`]). The caller
/// commits on [`PluginPutOutcome::Inserted`]; otherwise nothing was written.
pub(crate) async fn put(tx: &mut impl PluginPutTx, p: PluginPut) -> Result<PluginPutOutcome> {
    if tx.plugin_insert(&p).await? {
        return Ok(PluginPutOutcome::Inserted);
    }
    match tx.digest_of(&p.name, &p.version).await? {
        Some(existing) if existing != p.digest => Err(StoreError::VersionConflict {
            name: p.name,
            version: p.version,
            existing,
        }),
        _ => Ok(PluginPutOutcome::AlreadyPresent),
    }
}
