//! Registering a component: insert, and when nothing was inserted tell an
//! identical registration (a no-op) from a version taken by other bytes;
//! and keying the versions registered before `version_key` existed. The
//! order is decided here once; each backend supplies the statements
//! ([`PluginPutTx`], [`VersionKeys`]).

use super::rows::version_key_of;
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

/// The statements of keying versions registered before `version_key`.
pub(crate) trait VersionKeys {
    /// Up to `limit` `(digest, version)` of plugins without a key.
    async fn unkeyed(&mut self, limit: i64) -> Result<Vec<(String, String)>>;
    async fn key_set(&mut self, digest: &str, key: &str) -> Result<()>;
}

/// Gives the versions registered before `version_key` existed their key
/// (migration 0012), a page at a time; none are left after the first open.
pub(crate) async fn backfill_version_keys(keys: &mut impl VersionKeys) -> Result<()> {
    const PAGE: i64 = 256;
    loop {
        let unkeyed = keys.unkeyed(PAGE).await?;
        for (digest, version) in &unkeyed {
            keys.key_set(digest, &version_key_of(version)?).await?;
        }
        if (unkeyed.len() as i64) < PAGE {
            return Ok(());
        }
    }
}
