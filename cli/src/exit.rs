//! From an error to what the user sees: one line on stderr, and exit code
//! 2 for bad input (theirs to fix), 1 for everything else.

use ratchet_runtime::client::{ClientError, ErrorKind};
use ratchet_runtime::manifest::ManifestError;
use ratchet_runtime::plugin::PluginError;
use ratchet_runtime::registry::RegistryError;
use ratchet_runtime::relay::RelayError;
use ratchet_runtime::store::StoreError;

/// An error in what the user gave us (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

pub(super) fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

pub(super) fn exit_code(e: &anyhow::Error) -> u8 {
    let plugin_input = PluginError::is_bad_component;
    let store_input = |s: &StoreError| {
        matches!(
            s,
            StoreError::UnsupportedUrl(_) | StoreError::VersionConflict { .. }
        )
    };
    let bad_input = e.chain().any(|c| {
        c.is::<BadInput>()
            || c.downcast_ref::<ClientError>().is_some_and(|c| {
                matches!(
                    c.kind(),
                    ErrorKind::Invalid | ErrorKind::NotFound | ErrorKind::Conflict
                )
            })
            || c.is::<ManifestError>()
            || c.downcast_ref::<StoreError>().is_some_and(store_input)
            || c.downcast_ref::<PluginError>().is_some_and(plugin_input)
            || matches!(
                c.downcast_ref::<RelayError>(),
                Some(RelayError::Sink { .. })
            )
            || match c.downcast_ref::<RegistryError>() {
                Some(
                    RegistryError::Manifest(_)
                    | RegistryError::Refused(_)
                    | RegistryError::NotFound(_),
                ) => true,
                Some(RegistryError::Plugin(p)) => plugin_input(p),
                Some(RegistryError::Store(s)) => store_input(s),
                None => false,
            }
    });
    if bad_input { 2 } else { 1 }
}
