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

use std::convert::Infallible;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng, TryRng};
use sha2::{Digest, Sha256};
use wasmtime_wasi::{HostWallClock, WasiCtxBuilder};

use super::Invocation;

/// Installs the attempt's clock and generators. One hash is taken per
/// attempt (the insecure seed needs its value up front); a generator is
/// seeded at its first draw, so a stage that draws nothing pays nothing
/// more.
pub(super) fn install(wasi: &mut WasiCtxBuilder, inv: &Invocation) {
    let stage = stage_seed(&inv.run_id, &inv.stage);
    let mut half = [0u8; 16];
    half.copy_from_slice(&stage[..16]);
    wasi.secure_random(SeededOnDraw::new(stage, "secure"))
        .insecure_random(SeededOnDraw::new(stage, "insecure"))
        .insecure_random_seed(u128::from_le_bytes(half))
        .wall_clock(ReplayedWallClock::new(inv.started_at_ms));
}

/// 32 bytes for one stage of one run: each name is length-prefixed, so
/// (`ab`, `c`) and (`a`, `bc`) seed differently.
fn stage_seed(run_id: &str, stage: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in ["ratchet-replay-v1", run_id, stage] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize().into()
}

/// A generator seeded by (stage seed, purpose) when first drawn from.
struct SeededOnDraw {
    stage: [u8; 32],
    purpose: &'static str,
    rng: Option<StdRng>,
}

impl SeededOnDraw {
    fn new(stage: [u8; 32], purpose: &'static str) -> Self {
        Self {
            stage,
            purpose,
            rng: None,
        }
    }

    fn rng(&mut self) -> &mut StdRng {
        let (stage, purpose) = (self.stage, self.purpose);
        self.rng.get_or_insert_with(|| {
            let seed: [u8; 32] = Sha256::new()
                .chain_update(stage)
                .chain_update(purpose.as_bytes())
                .finalize()
                .into();
            StdRng::from_seed(seed)
        })
    }
}

impl TryRng for SeededOnDraw {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.rng().next_u32())
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.rng().next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.rng().fill_bytes(dst);
        Ok(())
    }
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

    fn draws(run: &str, stage: &str, purpose: &'static str) -> [u64; 2] {
        let mut rng = SeededOnDraw::new(stage_seed(run, stage), purpose);
        [rng.next_u64(), rng.next_u64()]
    }

    /// Seen failing with the names concatenated without their lengths.
    #[test]
    fn seeds_tell_stages_and_runs_apart() {
        let a = draws("run", "draft", "secure");
        assert_eq!(a, draws("run", "draft", "secure"), "same stage, same draws");
        assert_ne!(a, draws("run", "drafts", "secure"));
        assert_ne!(a, draws("run", "draft", "insecure"));
        assert_ne!(stage_seed("ab", "c"), stage_seed("a", "bc"));
    }

    #[test]
    fn the_wall_clock_starts_at_the_first_attempt() {
        let clock = ReplayedWallClock::new(1_700_000_000_000);
        let now = clock.now();
        assert!(now >= Duration::from_millis(1_700_000_000_000));
        assert!(now < Duration::from_millis(1_700_000_000_000) + Duration::from_secs(3600));
    }
}
