//! A claim under the operator's caps on attempts running at once per
//! plugin (`[concurrency]`): the order is decided here once; each backend
//! supplies the statements ([`CappedClaimTx`]).
//!
//! For each capped plugin, in name order: claims of it are serialized
//! until the claim's commit (PostgreSQL: an advisory lock per plugin;
//! SQLite: the one writer), the jobs of its versions running under a live
//! lease are counted, and at most the slots left are claimed. Counting
//! under the lock is what makes the cap hold across workers: two claims
//! counting at once under `SKIP LOCKED` would each see the same free slot.
//! Then the jobs of every other plugin are claimed as usual with the rest
//! of the limit. Capped plugins' jobs therefore go first within a claim.

use super::{ClaimedJob, JobClaim, Result};

/// The statements of a capped claim, inside one open transaction.
pub(crate) trait CappedClaimTx {
    /// Holds off every other claim of `plugin` until this transaction ends.
    async fn cap_lock(&mut self, plugin: &str) -> Result<()>;
    /// The digests of every registered version of `plugin`.
    async fn plugin_digests(&mut self, plugin: &str) -> Result<Vec<String>>;
    /// How many jobs of these digests are running under a lease that has
    /// not expired at `now`.
    async fn running(&mut self, digests: &[String], now: i64) -> Result<i64>;
    /// The usual claim, among the jobs of `digests` (`only`) or among every
    /// job but theirs.
    async fn claim_among(
        &mut self,
        c: &JobClaim,
        digests: &[String],
        only: bool,
    ) -> Result<Vec<ClaimedJob>>;
}

/// Claims up to `c.limit` jobs, none past its plugin's cap.
pub(crate) async fn claim(tx: &mut impl CappedClaimTx, c: &JobClaim) -> Result<Vec<ClaimedJob>> {
    let limit = c.limit.max(1);
    let mut claimed = Vec::new();
    let mut capped = Vec::new();
    for cap in c.caps.iter() {
        tx.cap_lock(&cap.plugin).await?;
        let digests = tx.plugin_digests(&cap.plugin).await?;
        let left = limit - claimed.len();
        let slots = cap.cap - tx.running(&digests, c.now).await?;
        if left > 0 && slots > 0 && !digests.is_empty() {
            let some = JobClaim {
                limit: left.min(slots as usize),
                ..c.clone()
            };
            claimed.extend(tx.claim_among(&some, &digests, true).await?);
        }
        capped.extend(digests);
    }
    let left = limit - claimed.len();
    if left > 0 {
        let rest = JobClaim {
            limit: left,
            ..c.clone()
        };
        claimed.extend(tx.claim_among(&rest, &capped, false).await?);
    }
    Ok(claimed)
}
