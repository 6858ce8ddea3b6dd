//! Canonical-first writes: insert unless the key is taken, and return what
//! is stored, the winner either way. For one artifact (key `(run, stage,
//! output)`; the digest returned is the only one a caller may use) and for
//! one journaled model call (key `(run, stage, index)`). Each backend
//! supplies the statements ([`CanonicalTx`], [`ModelCallTx`]).

use super::{ArtifactPut, CanonicalArtifact, ModelCall, ModelCallPut, Result};

/// The statements of the canonical-first insert, inside one transaction.
pub(crate) trait CanonicalTx {
    /// Inserts unless the key is taken: the digest inserted, if it was.
    async fn artifact_insert(&mut self, a: &ArtifactPut<'_>) -> Result<Option<String>>;
    /// The digest stored under the key (committed by the time the insert
    /// returned, under READ COMMITTED or SQLite's single writer).
    async fn artifact_digest(&mut self, a: &ArtifactPut<'_>) -> Result<String>;
}

/// Stores `a` canonical-first and returns the stored winner either way.
pub(crate) async fn put(
    tx: &mut impl CanonicalTx,
    a: ArtifactPut<'_>,
) -> Result<CanonicalArtifact> {
    if let Some(digest) = tx.artifact_insert(&a).await? {
        return Ok(CanonicalArtifact {
            digest,
            inserted: true,
        });
    }
    Ok(CanonicalArtifact {
        digest: tx.artifact_digest(&a).await?,
        inserted: false,
    })
}

/// The statements of journaling a model call, inside one transaction.
pub(crate) trait ModelCallTx {
    /// Inserts unless the call's `(run, stage, index)` is taken.
    async fn model_call_insert(&mut self, m: &ModelCallPut) -> Result<()>;
    /// The call stored under the key.
    async fn model_call_read(&mut self, m: &ModelCallPut) -> Result<ModelCall>;
}

/// Journals `m` canonical-first and returns the stored call, the earlier
/// one if another attempt recorded it first.
pub(crate) async fn put_model_call(
    tx: &mut impl ModelCallTx,
    m: &ModelCallPut,
) -> Result<ModelCall> {
    tx.model_call_insert(m).await?;
    tx.model_call_read(m).await
}
