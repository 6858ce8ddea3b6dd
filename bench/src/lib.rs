//! `ratchet bench`: Ratchet measured against the raw limit of its own
//! database in the same run, so figures from a noisy shared machine are
//! read as ratios. Each backend gets a scratch database (a temporary SQLite
//! file; a fresh Postgres schema, dropped afterwards).

mod relay;
mod report;
mod rig;
mod scenarios;

use std::time::Duration;

use serde::Serialize;

pub use relay::RelayPoint;
pub use report::{peer_table, table};
pub use rig::Scratch;
pub use scenarios::fanout_pipeline;

/// Sizes of every scenario.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Scenario 1: transactions per client.
    pub raw_txns: usize,
    /// Scenarios 2 and 5: runs of the chain pipeline in all or, if `None`,
    /// as many as the Wasm chain burns down in `chain_seconds`.
    pub runs: Option<usize>,
    pub chain_seconds: f64,
    /// Runs submitted and burnt down at a time, the native chain's turn
    /// and the Wasm chain's alternating.
    pub round_runs: usize,
    /// Stages per chain run.
    pub chain: usize,
    /// Worker tasks (and raw-limit clients).
    pub workers: usize,
    /// Scenario 3: the large fan-out; the small one is a tenth of it.
    pub fanout: usize,
    /// Scenario 4: dependency releases sampled.
    pub latency_samples: usize,
    /// Per-call instantiate + call samples.
    pub calls: usize,
    /// Scenario 6: runs of each of Obelisk's fan-out sizes.
    pub peer_runs: usize,
    /// Scenario 7: plugins of other names, then versions of its own, added
    /// to the registry.
    pub registered: usize,
    /// Scenario 7: submits timed at each registry size.
    pub submit_samples: usize,
    /// Scenario 8: the NATS server with JetStream the relay publishes to;
    /// without one, scenario 8 is not run.
    pub nats: Option<String>,
    /// Scenario 8: events in the backlog the relay works off, and as many
    /// raw publishes.
    pub relay_events: usize,
}

/// Obelisk 0.41 on SQLite, measured on this kind of machine (issue #6): a
/// workflow fanning out this many child activities took this many seconds.
pub const OBELISK_FANOUT: [(usize, f64); 2] = [(500, 0.6), (4_000, 19.5)];

impl BenchConfig {
    pub fn full() -> Self {
        Self {
            raw_txns: 1000,
            runs: None,
            chain_seconds: 10.0,
            round_runs: 2_000,
            chain: 5,
            workers: 64,
            fanout: 10_000,
            latency_samples: 300,
            calls: 5000,
            peer_runs: 5,
            registered: 1_000,
            submit_samples: 200,
            nats: None,
            relay_events: 10_000,
        }
    }

    /// A run of a few seconds that exercises every scenario (CI).
    pub fn smoke() -> Self {
        Self {
            raw_txns: 50,
            runs: Some(20),
            chain_seconds: 0.0,
            round_runs: 20,
            chain: 3,
            workers: 4,
            fanout: 200,
            latency_samples: 20,
            calls: 200,
            peer_runs: 1,
            registered: 50,
            submit_samples: 10,
            nats: None,
            relay_events: 200,
        }
    }
}

/// One fan-out/fan-in size.
#[derive(Debug, Clone, Serialize)]
pub struct FanoutPoint {
    pub stages: usize,
    /// Parsing, planning and submitting the run, before the burn-down.
    pub submit_seconds: f64,
    /// The burn-down: from the worker's start to nothing left to run.
    pub seconds: f64,
    pub per_stage_us: f64,
    /// Resident memory of this process when the burn-down started, the
    /// pipeline submitted and dropped.
    pub rss_at_start_mb: f64,
    /// Peak resident memory during the burn-down (VmHWM, reset at start).
    pub peak_rss_mb: f64,
    /// `audit --run` of the finished run: its time, and the peak resident
    /// memory while it ran (reset at its start).
    pub audit_seconds: f64,
    pub audit_peak_rss_mb: f64,
}

/// Scenario 7: the median time to submit the chain pipeline as the
/// registry grows.
#[derive(Debug, Clone, Serialize)]
pub struct SubmitCost {
    /// Plugins of other names added, then as many versions of `pass`.
    pub registered: usize,
    /// With the bench plugins alone.
    pub alone_us: f64,
    /// With `registered` plugins of other names.
    pub other_plugins_us: f64,
    /// With `registered` more versions of the plugin the pipeline runs too.
    pub own_versions_us: f64,
}

/// Scenario 6: one of Obelisk's fan-out sizes, run as scenario 3 does.
#[derive(Debug, Clone, Serialize)]
pub struct PeerPoint {
    pub stages: usize,
    /// Obelisk's time for a fan-out of as many children.
    pub obelisk_seconds: f64,
    /// Each run's whole time: parsing, planning, submitting, burning down.
    pub totals_seconds: Vec<f64>,
    pub median_seconds: f64,
    /// `obelisk_seconds / median_seconds`.
    pub times_faster: f64,
}

/// Every figure of one backend.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    pub raw_txn_per_s: f64,
    pub stage_completions_per_s: f64,
    /// `stage_completions_per_s / raw_txn_per_s`.
    pub ratio: f64,
    /// Runs of the chain burnt down in (2), and again in (5).
    pub chain_runs: usize,
    /// The Wasm chain's burn-downs, in all.
    pub chain_seconds: f64,
    /// Stage completions per commit transaction in (2) (group commit).
    pub completions_per_commit: f64,
    pub release_latency_p50_ms: f64,
    pub release_latency_p99_ms: f64,
    pub fanout: Vec<FanoutPoint>,
    /// Time per stage at the large fan-out over time per stage at the small.
    pub fanout_growth: f64,
    /// A stage mapped over a list as long as the large fan-out.
    pub map: FanoutPoint,
    /// Time per stage of the map over time per stage of the large fan-out
    /// (burn-downs only).
    pub map_vs_fanout: f64,
    /// The same with each one's submission counted: a map writes while it
    /// burns down the rows (jobs, edges, bindings) a fan-out writes when
    /// it is submitted.
    pub map_vs_fanout_submitted: f64,
    pub native_stage_completions_per_s: f64,
    /// Wasm chain time over native chain time (1.0 = no overhead).
    pub wasm_vs_native: f64,
    pub instantiate_call_us: f64,
    pub peer: Vec<PeerPoint>,
    pub submit: SubmitCost,
    /// Scenario 8, when a NATS server was given.
    pub relay: Option<RelayPoint>,
}

/// A run's time per stage with its submission counted, µs.
fn submitted_per_stage(p: &FanoutPoint) -> f64 {
    p.per_stage_us * (p.submit_seconds + p.seconds) / p.seconds.max(1e-9)
}

/// Locks `m`, taking its value even if a panicking holder poisoned it: the
/// bench's mutexes guard samples a panic cannot leave half-written.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn per_s(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Runs every scenario on one scratch database.
pub async fn run_backend(
    scratch: &Scratch,
    config: &BenchConfig,
    progress: &dyn Fn(&str),
) -> anyhow::Result<BackendReport> {
    let raw = scenarios::raw_limit(scratch, config).await?;
    progress(&format!("raw limit: {raw:.0} txn/s"));
    let chains = scenarios::chains(scratch, config).await?;
    let completions = chains.runs * config.chain;
    let (wasm, native) = (
        per_s(completions, chains.wasm),
        per_s(completions, chains.native),
    );
    let per_commit = chains.per_commit;
    progress(&format!(
        "chain (Wasm): {} runs x {} stages in {:.1} s, {wasm:.0} stage completions/s, {per_commit:.1} per commit",
        chains.runs,
        config.chain,
        chains.wasm.as_secs_f64()
    ));
    progress(&format!(
        "chain (native): the same in {:.1} s, {native:.0} stage completions/s",
        chains.native.as_secs_f64()
    ));
    let (p50, p99) = scenarios::release_latency(scratch, config).await?;
    progress(&format!(
        "release latency: p50 {:.2} ms, p99 {:.2} ms",
        ms(p50),
        ms(p99)
    ));
    let mut fanout = Vec::new();
    for stages in [config.fanout / 10, config.fanout] {
        let point = scenarios::fanout(scratch, config, stages.max(1)).await?;
        progress(&format!(
            "fan-out {stages}: submitted in {:.3} s, burnt down in {:.3} s, {:.0} µs/stage, RSS {:.0} MB at start, peak {:.0} MB; audited in {:.3} s, peak {:.0} MB",
            point.submit_seconds,
            point.seconds,
            point.per_stage_us,
            point.rss_at_start_mb,
            point.peak_rss_mb,
            point.audit_seconds,
            point.audit_peak_rss_mb
        ));
        fanout.push(point);
    }
    let map = scenarios::map(scratch, config, config.fanout.max(1)).await?;
    let map_vs_fanout = map.per_stage_us / fanout[1].per_stage_us.max(1e-9);
    let map_vs_fanout_submitted = submitted_per_stage(&map) / submitted_per_stage(&fanout[1]);
    progress(&format!(
        "map over {}: submitted in {:.3} s, burnt down in {:.3} s, {:.0} µs/stage ({map_vs_fanout:.2}x the fan-out's; {map_vs_fanout_submitted:.2}x with submissions)",
        map.stages, map.submit_seconds, map.seconds, map.per_stage_us
    ));
    let call = scenarios::instantiate_call(scratch, config).await?;
    progress(&format!(
        "instantiate + call: {:.1} µs",
        call.as_secs_f64() * 1e6
    ));
    let peer = run_peer(scratch, config, progress).await?;
    let submit = scenarios::submit_cost(scratch, config).await?;
    progress(&format!(
        "submit: {:.0} µs; with {n} plugins of other names {:.0} µs; with {n} more versions of its own {:.0} µs",
        submit.alone_us,
        submit.other_plugins_us,
        submit.own_versions_us,
        n = submit.registered,
    ));
    let relay = match &config.nats {
        Some(nats) => {
            let point = relay::relay(scratch, config, nats).await?;
            progress(&format!(
                "relay to JetStream: {:.0} events/s against {:.0} raw publishes/s ({:.0} before, {:.0} after; {} in flight), ratio {:.2}; commit to acknowledgement p50 {:.1} ms, p99 {:.1} ms",
                point.relay_events_per_s,
                point.raw_publishes_per_s,
                point.raw_before_per_s,
                point.raw_after_per_s,
                point.in_flight,
                point.ratio,
                point.commit_to_ack_p50_ms,
                point.commit_to_ack_p99_ms
            ));
            Some(point)
        }
        None => None,
    };
    Ok(BackendReport {
        raw_txn_per_s: raw,
        stage_completions_per_s: wasm,
        ratio: wasm / raw.max(1e-9),
        chain_runs: chains.runs,
        chain_seconds: chains.wasm.as_secs_f64(),
        completions_per_commit: per_commit,
        release_latency_p50_ms: ms(p50),
        release_latency_p99_ms: ms(p99),
        fanout_growth: fanout[1].per_stage_us / fanout[0].per_stage_us.max(1e-9),
        fanout,
        map,
        map_vs_fanout,
        map_vs_fanout_submitted,
        native_stage_completions_per_s: native,
        wasm_vs_native: native / wasm.max(1e-9),
        instantiate_call_us: call.as_secs_f64() * 1e6,
        peer,
        submit,
        relay,
    })
}

/// Scenario 6 alone: Obelisk's fan-out sizes, `config.peer_runs` runs of
/// each, the sizes taking turns so that a slow minute of the machine falls
/// on both.
pub async fn run_peer(
    scratch: &Scratch,
    config: &BenchConfig,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<PeerPoint>> {
    let mut totals = vec![Vec::new(); OBELISK_FANOUT.len()];
    for _ in 0..config.peer_runs.max(1) {
        for ((stages, _), runs) in OBELISK_FANOUT.iter().zip(&mut totals) {
            let point = scenarios::fanout(scratch, config, *stages).await?;
            runs.push(point.submit_seconds + point.seconds);
        }
    }
    let peer: Vec<PeerPoint> = OBELISK_FANOUT
        .iter()
        .zip(totals)
        .map(|(&(stages, obelisk_seconds), mut runs)| {
            runs.sort_by(f64::total_cmp);
            let median_seconds = median(&runs);
            PeerPoint {
                stages,
                obelisk_seconds,
                totals_seconds: runs,
                median_seconds,
                times_faster: obelisk_seconds / median_seconds.max(1e-9),
            }
        })
        .collect();
    for p in &peer {
        progress(&format!(
            "fan-out {} against Obelisk: median {:.3} s of {} runs ({:.3}–{:.3}), {:.1}x Obelisk's {} s",
            p.stages,
            p.median_seconds,
            p.totals_seconds.len(),
            p.totals_seconds.first().copied().unwrap_or_default(),
            p.totals_seconds.last().copied().unwrap_or_default(),
            p.times_faster,
            p.obelisk_seconds
        ));
    }
    Ok(peer)
}

/// The median of sorted values (the mean of the middle two of an even count).
pub(crate) fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
