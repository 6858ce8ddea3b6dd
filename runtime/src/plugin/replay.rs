//! WASI's clocks and random numbers, made to replay across a stage's
//! attempts. Their hooks are synchronous and language runtimes read them
//! implicitly (hash seeds, `Date.now()`), so they cannot go through the
//! journal call by call; they are derived from the stage's identity instead:
//!
//! - random numbers (`wasi:random`, secure and insecure alike) come from
//!   generators seeded by (run, stage): every attempt draws the same ones;
//! - the wall clock reads as the first attempt's start plus the time this
//!   attempt has run, so a date put into a prompt is the same on a retry;
//! - the monotonic clock is the host's: it keeps advancing, and a guest's
//!   wait still ends.
//!
//! Guest randomness is therefore predictable from the run's and stage's
//! names: a stage must not make secrets from it.

use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use sha2::{Digest, Sha256};
use wasmtime_wasi::{HostWallClock, WasiCtxBuilder};

use super::Invocation;

/// Installs the attempt's clock and generators.
pub(super) fn install(wasi: &mut WasiCtxBuilder, inv: &Invocation) {
    let seed = |purpose: &str| seed(purpose, &inv.run_id, &inv.stage);
    let insecure_seed = seed("insecure-seed");
    let mut half = [0u8; 16];
    half.copy_from_slice(&insecure_seed[..16]);
    wasi.secure_random(StdRng::from_seed(seed("secure")))
        .insecure_random(StdRng::from_seed(seed("insecure")))
        .insecure_random_seed(u128::from_le_bytes(half))
        .wall_clock(ReplayedWallClock::new(inv.started_at_ms));
}

/// 32 bytes for one purpose of one stage of one run: each name is
/// length-prefixed, so (`ab`, `c`) and (`a`, `bc`) seed differently.
fn seed(purpose: &str, run_id: &str, stage: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in ["ratchet-replay-v1", purpose, run_id, stage] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize().into()
}

/// The first attempt's start, advanced by this attempt's running time.
struct ReplayedWallClock {
    origin: Duration,
    started: Instant,
}

impl ReplayedWallClock {
    fn new(started_at_ms: i64) -> Self {
        Self {
            origin: Duration::from_millis(u64::try_from(started_at_ms).unwrap_or(0)),
            started: Instant::now(),
        }
    }
}

impl HostWallClock for ReplayedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        self.origin + self.started.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seen failing with the names concatenated without their lengths.
    #[test]
    fn seeds_tell_stages_and_runs_apart() {
        let a = seed("secure", "run", "draft");
        assert_eq!(a, seed("secure", "run", "draft"), "same stage, same seed");
        assert_ne!(a, seed("secure", "run", "drafts"));
        assert_ne!(a, seed("insecure", "run", "draft"));
        assert_ne!(seed("secure", "ab", "c"), seed("secure", "a", "bc"));
    }

    #[test]
    fn the_wall_clock_starts_at_the_first_attempt() {
        let clock = ReplayedWallClock::new(1_700_000_000_000);
        let now = clock.now();
        assert!(now >= Duration::from_millis(1_700_000_000_000));
        assert!(now < Duration::from_millis(1_700_000_000_000) + Duration::from_secs(3600));
    }
}
