//! The canonical-first insert of one artifact: insert unless its key
//! `(run, stage, output)` is taken, and when nothing was inserted read the
//! winner. The digest it returns is the only one a caller may use. Each
//! backend supplies the two statements ([`CanonicalTx`]).

use super::{CanonicalArtifact, CanonicalPut, Result};

/// The statements of the canonical-first insert, inside one transaction.
pub(crate) trait CanonicalTx {
    /// Inserts unless the key is taken: the digest inserted, if it was.
    async fn artifact_insert(&mut self, a: &CanonicalPut<'_>) -> Result<Option<String>>;
    /// The digest stored under the key (committed by the time the insert
    /// returned, under READ COMMITTED or SQLite's single writer).
    async fn artifact_digest(&mut self, a: &CanonicalPut<'_>) -> Result<String>;
}

/// Stores `a` canonical-first and returns the stored winner either way.
pub(crate) async fn put(
    tx: &mut impl CanonicalTx,
    a: CanonicalPut<'_>,
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
