//! The scenarios of `ratchet bench`, each on a database of its own.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use wasm_encoder::ComponentSection;

use crate::lock;
use crate::rig::{Rig, Scratch, chain_pipeline, rig};
use crate::{BenchConfig, FanoutPoint, SubmitCost, median, per_s, percentile};
use ratchet_runtime::audit;
use ratchet_runtime::bundled::BENCH_PLUGINS;
use ratchet_runtime::digest::sha256_hex;
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::plugin::{Invocation, Payload};
use ratchet_runtime::scheduler::SchedulerProbe;
use ratchet_runtime::store::{ArtifactPut, ClaimedJob, PluginPut, RawCompletion};
use ratchet_runtime::worker::{self, WorkerOptions};

/// (1) Committed transactions/s of the completion's statement shape. Each
/// client updates a job row of its own, as each completion does: clients
/// sharing one row would queue on its lock and understate the limit.
pub(super) async fn raw_limit(scratch: &Scratch, config: &BenchConfig) -> anyhow::Result<f64> {
    let rig = rig(scratch, "raw", config.workers).await?;
    let run = rig
        .submit(&chain_pipeline(config.workers)?, b"raw".to_vec())
        .await?;
    let jobs = rig.store.job_list(&run).await?;
    let start = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for (client, job) in jobs.iter().enumerate() {
        let (store, run, clock) = (rig.store.clone(), run.clone(), rig.clock.clone());
        let job_id = job.id;
        let txns = config.raw_txns;
        clients.spawn(async move {
            for i in 0..txns {
                let artifact = Payload::new(
                    format!("o{client}-{i}"),
                    "application/octet-stream",
                    format!("{client}-{i}").into_bytes(),
                );
                let put = ArtifactPut {
                    run_id: &run,
                    stage: "raw",
                    artifact: &artifact,
                    attempt: 1,
                    plugin_digest: None,
                    now: clock.now_ms(),
                };
                store.raw_completion(RawCompletion { job_id, put }).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = clients.join_next().await {
        done??;
    }
    Ok(per_s(jobs.len() * config.raw_txns, start.elapsed()))
}

/// What (2) and (5) measured: the Wasm chain and the native one, burnt
/// down in turns.
pub(super) struct Chains {
    pub runs: usize,
    pub wasm: Duration,
    pub native: Duration,
    /// Completions per commit transaction of the Wasm chain.
    pub per_commit: f64,
}

/// (2) and (5): rounds of `round_runs` chain runs, each round submitted to
/// and burnt down on the Wasm rig and on the native one in turns (which
/// goes first alternates), so that a slow minute of a shared machine
/// weighs on both. `runs` runs in all or, without it, rounds until the
/// Wasm burn-downs have taken `chain_seconds`.
pub(super) async fn chains(scratch: &Scratch, config: &BenchConfig) -> anyhow::Result<Chains> {
    let rigs = [
        rig(scratch, "chain_wasm", config.workers).await?,
        rig(scratch, "chain_native", config.workers).await?,
    ];
    let scheds = [
        rigs[0].scheduler(false, None),
        rigs[1].scheduler(true, None),
    ];
    let pipeline = Arc::new(chain_pipeline(config.chain)?);
    let round_runs = config.round_runs.max(1);
    let (mut done, mut round, mut times) = (0, 0, [Duration::ZERO; 2]);
    loop {
        let runs = match config.runs {
            Some(total) => total.saturating_sub(done).min(round_runs),
            None if round > 0 && times[0].as_secs_f64() >= config.chain_seconds => 0,
            None => round_runs,
        };
        if runs == 0 {
            break;
        }
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            rigs[i].submit_many(&pipeline, done..done + runs).await?;
            times[i] += rigs[i].burn_down(scheds[i].clone(), config.workers).await?;
        }
        done += runs;
        round += 1;
    }
    let commits = scheds[0].commit_stats();
    let per_commit = commits.completions.load(Ordering::Relaxed) as f64
        / commits.transactions.load(Ordering::Relaxed).max(1) as f64;
    Ok(Chains {
        runs: done,
        wasm: times[0],
        native: times[1],
        per_commit,
    })
}

/// The fan-out/fan-in pipeline of (3): `stages` parallel `pass` stages of
/// the run's input, then one `noop` join after all of them.
pub fn fanout_pipeline(stages: usize) -> String {
    let mut text = String::from("name = \"fanout\"\n");
    for i in 0..stages {
        text.push_str(&format!(
            "[[stage]]\nname = \"f{i}\"\nplugin = \"pass@^1\"\ninputs = {{ in = \"$input\" }}\n"
        ));
    }
    let all: Vec<String> = (0..stages).map(|i| format!("\"f{i}\"")).collect();
    text.push_str(&format!(
        "[[stage]]\nname = \"join\"\nplugin = \"noop@^1\"\nafter = [{}]\n",
        all.join(", ")
    ));
    text
}

/// (3) One run: `stages` parallel stages, then one join after all of them.
pub(super) async fn fanout(
    scratch: &Scratch,
    config: &BenchConfig,
    stages: usize,
) -> anyhow::Result<FanoutPoint> {
    let text = fanout_pipeline(stages);
    let name = format!("fanout_{stages}");
    one_run(
        scratch,
        config,
        &name,
        &text,
        b"fan".to_vec(),
        stages,
        stages + 1,
    )
    .await
}

/// The map over a list: `split` the input into `elements` paragraphs, `pass`
/// each in a job of its own (`map`), then one join after all of them.
pub const MAP_PIPELINE: &str = r#"
name = "map"
[[stage]]
name = "split"
plugin = "split@^1"
inputs = { text = "$input" }
[[stage]]
name = "each"
plugin = "pass@^1"
map = "split.parts"
inputs = { in = "split.parts" }
[[stage]]
name = "join"
plugin = "noop@^1"
after = ["each"]
"#;

/// (3b) One run mapping a stage over `elements` paragraphs: against the
/// fan-out of as many static stages, per stage.
pub(super) async fn map(
    scratch: &Scratch,
    config: &BenchConfig,
    elements: usize,
) -> anyhow::Result<FanoutPoint> {
    let paragraphs: Vec<String> = (0..elements).map(|i| format!("p{i}")).collect();
    let input = paragraphs.join("\n\n").into_bytes();
    let name = format!("map_{elements}");
    // split, the elements, the mapped stage's join, the join after it.
    let counted = elements + 3;
    one_run(
        scratch,
        config,
        &name,
        MAP_PIPELINE,
        input,
        elements,
        counted,
    )
    .await
}

/// One run of `text` on input `input`, burnt down by `config.workers`
/// worker tasks; its time per stage is over `counted` stages.
async fn one_run(
    scratch: &Scratch,
    config: &BenchConfig,
    name: &str,
    text: &str,
    input: Vec<u8>,
    stages: usize,
    counted: usize,
) -> anyhow::Result<FanoutPoint> {
    let rig = rig(scratch, name, config.workers).await?;
    let submitted = Instant::now();
    let pipeline = Pipeline::parse("bench pipeline", text)?;
    let run = rig.submit(&pipeline, input).await?;
    let submit_seconds = submitted.elapsed().as_secs_f64();
    drop(pipeline);
    // Only what the burn-down needs counts: the peak starts again here.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_at_start_mb = memory_mb("VmRSS:");
    let elapsed = rig
        .burn_down(rig.scheduler(false, None), config.workers)
        .await?;
    let peak_rss_mb = memory_mb("VmHWM:");
    // The run's audit, with a peak of its own.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let audited = Instant::now();
    let report = audit::audit_store(rig.store.as_ref(), Some(&run), &mut |_| {}).await?;
    anyhow::ensure!(
        report.is_clean(),
        "the {name} run's audit: {:?}",
        report.violations
    );
    let state = rig.store.run_get(&run).await?.map(|r| r.state);
    anyhow::ensure!(
        state.as_ref().is_some_and(|s| s.to_string() == "succeeded"),
        "the {name} run ended {state:?}"
    );
    Ok(FanoutPoint {
        stages,
        submit_seconds,
        seconds: elapsed.as_secs_f64(),
        per_stage_us: elapsed.as_secs_f64() * 1e6 / counted as f64,
        rss_at_start_mb,
        peak_rss_mb,
        audit_seconds: audited.elapsed().as_secs_f64(),
        audit_peak_rss_mb: memory_mb("VmHWM:"),
    })
}

/// A memory figure of this process from `/proc/self/status`, in MB.
fn memory_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Records when a commit released a stage and when that stage started.
#[derive(Default)]
struct LatencyProbe {
    released: Mutex<HashMap<(String, String), Instant>>,
    samples: Mutex<Vec<Duration>>,
    sampled: Notify,
}

impl SchedulerProbe for LatencyProbe {
    fn released(&self, run_id: &str, stages: &[String]) {
        let now = Instant::now();
        let mut released = lock(&self.released);
        for stage in stages {
            released.insert((run_id.to_string(), stage.clone()), now);
        }
    }

    fn started(&self, job: &ClaimedJob) {
        let now = Instant::now();
        let key = (job.run_id.clone(), job.stage.clone());
        let released = lock(&self.released).remove(&key);
        if let Some(at) = released {
            lock(&self.samples).push(now - at);
            self.sampled.notify_one();
        }
    }
}

/// (4) From a stage's commit to its dependent's start, one run at a time.
pub(super) async fn release_latency(
    scratch: &Scratch,
    config: &BenchConfig,
) -> anyhow::Result<(Duration, Duration)> {
    let rig = rig(scratch, "latency", config.workers).await?;
    let probe = Arc::new(LatencyProbe::default());
    let sched = rig.scheduler(false, Some(probe.clone()));
    let opts = WorkerOptions {
        concurrency: config.workers,
        poll: Duration::from_millis(5),
        ..WorkerOptions::default()
    };
    let (stop, stopped) = watch::channel(false);
    let work = tokio::spawn(worker::run(
        rig.store.clone(),
        sched,
        rig.clock.clone(),
        opts,
        stopped,
    ));
    let pipeline = chain_pipeline(2)?;
    for i in 0..config.latency_samples {
        let sampled = probe.sampled.notified();
        rig.submit(&pipeline, format!("sample {i}").into_bytes())
            .await?;
        tokio::time::timeout(Duration::from_secs(60), sampled)
            .await
            .map_err(|_| anyhow::anyhow!("no dependency release within 60 s"))?;
    }
    let _ = stop.send(true);
    work.await??;
    let mut samples = std::mem::take(&mut *lock(&probe.samples));
    samples.sort();
    Ok((percentile(&samples, 0.5), percentile(&samples, 0.99)))
}

/// Per-call cost of a cached component: a fresh instance plus `run`.
pub(super) async fn instantiate_call(
    scratch: &Scratch,
    config: &BenchConfig,
) -> anyhow::Result<Duration> {
    let rig = rig(scratch, "calls", config.workers).await?;
    let noop = BENCH_PLUGINS
        .iter()
        .find(|(name, _)| *name == "noop")
        .map(|(_, bytes)| *bytes)
        .ok_or_else(|| anyhow::anyhow!("the noop plugin is not bundled"))?;
    let plugin = rig.host.inspect(noop).await?;
    let inv = Invocation {
        run_id: "bench".into(),
        stage: "bench".into(),
        attempt: 1,
        idempotency_key: "bench".into(),
        started_at_ms: 0,
    };
    for _ in 0..config.calls / 10 {
        let _ = rig.host.execute(&plugin, &inv, Vec::new()).await;
    }
    let start = Instant::now();
    for _ in 0..config.calls {
        let outcome = rig.host.execute(&plugin, &inv, Vec::new()).await;
        anyhow::ensure!(outcome.is_ok(), "noop failed: {:?}", outcome.err());
    }
    Ok(start.elapsed() / config.calls.max(1) as u32)
}

/// (7) What submitting a run costs as the registry grows: the median
/// submit of the chain pipeline with the bench plugins alone, then with
/// `config.registered` more plugins of other names, then with as many more
/// versions of `pass`, the plugin the chain runs. The variants are `pass`
/// with a custom section appended (another digest, the same code) under a
/// manifest of another name or version, put straight into the store: only
/// what a submit reads of them is measured, and compiling each would take
/// minutes.
pub(super) async fn submit_cost(
    scratch: &Scratch,
    config: &BenchConfig,
) -> anyhow::Result<SubmitCost> {
    let rig = rig(scratch, "submit", config.workers).await?;
    let pipeline = chain_pipeline(config.chain)?;
    let pass = BENCH_PLUGINS
        .iter()
        .find(|(name, _)| *name == "pass")
        .map(|(_, bytes)| *bytes)
        .ok_or_else(|| anyhow::anyhow!("the pass plugin is not bundled"))?;
    let manifest = rig.host.inspect(pass).await?.manifest.clone();
    let mut sample = 0;
    let mut median_us = async |rig: &Rig| -> anyhow::Result<f64> {
        let mut times = Vec::with_capacity(config.submit_samples);
        for _ in 0..config.submit_samples.max(1) {
            sample += 1;
            let start = Instant::now();
            rig.submit(&pipeline, format!("sample {sample}").into_bytes())
                .await?;
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
        times.sort_by(f64::total_cmp);
        Ok(median(&times))
    };
    let alone_us = median_us(&rig).await?;
    let mut variant = 0;
    let mut register = async |name: &str, version: semver::Version| -> anyhow::Result<()> {
        variant += 1;
        let mut component = pass.to_vec();
        let text = format!("bench variant {variant}");
        wasm_encoder::CustomSection {
            name: "ratchet-bench".into(),
            data: text.as_bytes().into(),
        }
        .append_to_component(&mut component);
        let mut manifest = manifest.clone();
        manifest.name = name.to_string();
        manifest.version = version;
        rig.store
            .plugin_put(PluginPut {
                digest: sha256_hex(&component),
                name: manifest.name.clone(),
                version: manifest.version.to_string(),
                manifest: toml::to_string(&manifest)?,
                component,
                contract: "0.2.0".into(),
                now: rig.clock.now_ms(),
            })
            .await?;
        Ok(())
    };
    for i in 0..config.registered {
        register(&format!("other-{i}"), semver::Version::new(1, 0, 0)).await?;
    }
    let other_plugins_us = median_us(&rig).await?;
    // Below the bundled 1.x, so the chain still runs the one it ran.
    for i in 0..config.registered {
        register("pass", semver::Version::new(0, 1, i as u64)).await?;
    }
    let own_versions_us = median_us(&rig).await?;
    Ok(SubmitCost {
        registered: config.registered,
        alone_us,
        other_plugins_us,
        own_versions_us,
    })
}
