//! How a scheduler retries, leases and batches.

use rand::RngExt;

/// Exponential backoff with jitter: `base * 2^(attempt-1)`, capped, then
/// scaled by a random factor in `[1 - jitter, 1 + jitter]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub base_ms: i64,
    pub max_ms: i64,
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base_ms: 1_000,
            max_ms: 5 * 60 * 1_000,
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// Delay before the attempt after `attempt` (1-based).
    pub fn delay_ms(&self, attempt: i64) -> i64 {
        let exp = (attempt - 1).clamp(0, 30) as u32;
        let raw = self.base_ms.saturating_mul(1i64 << exp).min(self.max_ms);
        let factor = 1.0 + self.jitter * (rand::rng().random::<f64>() * 2.0 - 1.0);
        ((raw as f64) * factor).round() as i64
    }
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Recorded on leases and attempts; host + pid by default.
    pub worker_id: String,
    pub lease_ms: i64,
    pub backoff: Backoff,
    /// Most completions committed in one transaction.
    pub commit_batch: usize,
    /// How long a commit waits for the next completion of the jobs the
    /// previous one claimed, while they keep coming (at most eight times
    /// this in all; zero: never waits; see `group_commit`).
    pub commit_linger: std::time::Duration,
    /// The operator's caps on attempts running at once per plugin
    /// (`[concurrency]` of the policy), enforced by every claim.
    pub caps: std::sync::Arc<[crate::store::PluginCap]>,
}

impl SchedulerConfig {
    pub fn new(worker_id: impl Into<String>) -> Self {
        Self {
            worker_id: worker_id.into(),
            lease_ms: 60_000,
            backoff: Backoff::default(),
            commit_batch: 64,
            commit_linger: std::time::Duration::from_millis(1),
            caps: std::sync::Arc::new([]),
        }
    }
}
