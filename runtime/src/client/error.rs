//! What a client operation can end with, sorted once for every face.

use std::time::Duration;

use crate::plugin::PluginError;
use crate::registry::RegistryError;
use crate::store::{self, StoreError};
use crate::worker::WorkerError;

/// What a client operation can end with. [`ClientError::kind`] sorts them
/// for the faces: the command line's exit code, the HTTP API's status.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(
        "run `{run}` is still {state} after {waited:?}; wait longer, or see `ratchet status {run}`"
    )]
    Timeout {
        run: String,
        state: store::RunState,
        waited: Duration,
    },
    #[error(
        "the worker did not stop within {0:?}; its attempts were abandoned and are retried once their leases expire"
    )]
    Abandoned(Duration),
}

/// What kind of failure an error is, the same for every face.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input is wrong: a pipeline, a component, a version (fix it).
    Invalid,
    /// What it names does not exist.
    NotFound,
    /// It exists, but its state does not allow this (a finished run).
    Conflict,
    /// The database or a worker failed; the same request may succeed later.
    Unavailable,
    /// Anything else: a bug or a corrupt row.
    Internal,
}

impl ClientError {
    pub fn kind(&self) -> ErrorKind {
        let store_kind = |e: &StoreError| match e {
            StoreError::UnsupportedUrl(_) => ErrorKind::Invalid,
            StoreError::VersionConflict { .. } => ErrorKind::Conflict,
            e if e.is_transient() => ErrorKind::Unavailable,
            e if e.is_refusal() => ErrorKind::Invalid,
            _ => ErrorKind::Internal,
        };
        let plugin_kind = |e: &PluginError| {
            if e.is_bad_component() {
                ErrorKind::Invalid
            } else {
                ErrorKind::Internal
            }
        };
        match self {
            ClientError::Registry(RegistryError::Manifest(_)) => ErrorKind::Invalid,
            ClientError::Registry(RegistryError::NotFound(_)) => ErrorKind::NotFound,
            ClientError::Registry(RegistryError::Refused(_)) => ErrorKind::Conflict,
            ClientError::Registry(RegistryError::Store(e)) | ClientError::Store(e) => store_kind(e),
            ClientError::Registry(RegistryError::Plugin(e)) | ClientError::Plugin(e) => {
                plugin_kind(e)
            }
            ClientError::Timeout { .. } => ErrorKind::Conflict,
            ClientError::Worker(_) | ClientError::Abandoned(_) => ErrorKind::Unavailable,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;
