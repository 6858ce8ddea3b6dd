//! The five scenarios of `ratchet bench`, each on a database of its own.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use wasm_encoder::ComponentSection;

use super::{BenchConfig, FanoutPoint, SubmitCost, median, per_s, percentile};
use crate::audit;
use crate::bundled::BENCH_PLUGINS;
use crate::clock::{Clock, SystemClock};
use crate::digest::sha256_hex;
use crate::llm::StochasticModel;
use crate::lock;
use crate::manifest::Pipeline;
use crate::plugin::{ExecError, ExecReport, HostConfig, Invocation, Payload, PluginHost};
use crate::registry;
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerProbe, StageExecutor};
use crate::store::{
    self, ArtifactPut, ClaimedJob, MeasuredStore, PluginPut, PostgresStore, RawCompletion,
    StoreError,
};
use crate::worker::{self, WorkerOptions};

/// Where the scenarios' databases live: a temporary folder of SQLite files,
/// or fresh schemas on a Postgres server, dropped by [`Scratch::cleanup`].
pub struct Scratch {
    dir: tempfile::TempDir,
    postgres: Option<String>,
    schemas: Mutex<Vec<String>>,
}

impl Scratch {
    pub fn sqlite() -> anyhow::Result<Self> {
        Ok(Self {
            dir: tempfile::tempdir()?,
            postgres: None,
            schemas: Mutex::default(),
        })
    }

    pub fn postgres(url: &str) -> anyhow::Result<Self> {
        Ok(Self {
            dir: tempfile::tempdir()?,
            postgres: Some(url.to_string()),
            schemas: Mutex::default(),
        })
    }

    /// A new, empty database for one scenario.
    async fn database(&self, name: &str) -> anyhow::Result<Arc<dyn MeasuredStore>> {
        let url = match &self.postgres {
            None => format!(
                "sqlite://{}",
                self.dir.path().join(format!("{name}.db")).display()
            ),
            Some(base) => {
                let (url, schema) = PostgresStore::scratch_schema(base, name).await?;
                lock(&self.schemas).push(schema);
                url
            }
        };
        Ok(store::open_measured(&url).await?)
    }

    pub async fn cleanup(self) -> anyhow::Result<()> {
        if let Some(base) = &self.postgres {
            let schemas = std::mem::take(&mut *lock(&self.schemas));
            for schema in schemas {
                PostgresStore::drop_scratch_schema(base, &schema).await?;
            }
        }
        Ok(())
    }
}

/// Tasks submitting the chain runs of a round.
const SUBMITTERS: usize = 8;

/// A database with the bench plugins registered, and a host.
struct Rig {
    store: Arc<dyn MeasuredStore>,
    host: Arc<PluginHost>,
    clock: Arc<dyn Clock>,
}

async fn rig(scratch: &Scratch, name: &str, workers: usize) -> anyhow::Result<Rig> {
    let store = scratch.database(name).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = HostConfig {
        cache_dir: Some(scratch.dir.path().join("components")),
        pooling: Some(workers as u32 * 2 + 16),
        ..HostConfig::default()
    };
    let host = Arc::new(PluginHost::new(
        store.clone(),
        Arc::new(StochasticModel),
        clock.clone(),
        config,
    )?);
    for (_, bytes) in BENCH_PLUGINS {
        registry::plugin_register(store.as_ref(), &host, bytes.to_vec(), clock.as_ref()).await?;
    }
    Ok(Rig { store, host, clock })
}

impl Rig {
    fn scheduler(&self, native: bool, probe: Option<Arc<dyn SchedulerProbe>>) -> Arc<Scheduler> {
        let executor: Arc<dyn StageExecutor> = if native {
            Arc::new(NativePass)
        } else {
            self.host.clone()
        };
        let mut sched = Scheduler::new(
            self.store.clone(),
            executor,
            self.clock.clone(),
            SchedulerConfig::new("bench"),
        );
        if let Some(probe) = probe {
            sched = sched.with_probe(probe);
        }
        Arc::new(sched)
    }

    async fn submit(&self, pipeline: &Pipeline, input: Vec<u8>) -> anyhow::Result<String> {
        let outcome = registry::run_submit(
            self.store.as_ref(),
            pipeline,
            input,
            None,
            self.clock.as_ref(),
        )
        .await?;
        Ok(outcome.run_id().to_string())
    }

    /// Submits the chain runs numbered `runs`, a few at a time (on Postgres
    /// they commit in parallel).
    async fn submit_many(
        &self,
        pipeline: &Arc<Pipeline>,
        runs: std::ops::Range<usize>,
    ) -> anyhow::Result<()> {
        let mut submitters = tokio::task::JoinSet::new();
        for first in 0..SUBMITTERS {
            let (store, clock, pipeline) =
                (self.store.clone(), self.clock.clone(), pipeline.clone());
            let mine: Vec<usize> = runs.clone().skip(first).step_by(SUBMITTERS).collect();
            submitters.spawn(async move {
                for i in mine {
                    let input = format!("run {i}").into_bytes();
                    registry::run_submit(store.as_ref(), &pipeline, input, None, clock.as_ref())
                        .await?;
                }
                anyhow::Ok(())
            });
        }
        while let Some(done) = submitters.join_next().await {
            done??;
        }
        Ok(())
    }

    /// Runs workers until nothing is left; returns how long that took.
    async fn burn_down(&self, sched: Arc<Scheduler>, workers: usize) -> anyhow::Result<Duration> {
        let opts = WorkerOptions {
            concurrency: workers,
            until_idle: true,
            poll: Duration::from_millis(5),
            ..WorkerOptions::default()
        };
        let (_stop, stopped) = watch::channel(false);
        let start = Instant::now();
        let stats =
            worker::run(self.store.clone(), sched, self.clock.clone(), opts, stopped).await?;
        let elapsed = start.elapsed();
        let dead = stats.dead.load(Ordering::Relaxed);
        anyhow::ensure!(dead == 0, "{dead} bench stages died: {}", stats.summary());
        Ok(elapsed)
    }
}

/// The bench-only native executor: `pass` in Rust, no Wasm.
struct NativePass;

#[async_trait::async_trait]
impl StageExecutor for NativePass {
    async fn run(
        &self,
        _digest: &str,
        _inv: &Invocation,
        inputs: Vec<Payload>,
    ) -> Result<(Result<Vec<Payload>, ExecError>, ExecReport), StoreError> {
        let outputs = inputs
            .into_iter()
            .filter(|p| p.name == "in")
            .map(|p| Payload {
                name: "out".into(),
                ..p
            })
            .collect();
        Ok((Ok(outputs), ExecReport::default()))
    }

    fn longest_attempt_ms(&self) -> u64 {
        u64::MAX
    }
}

fn chain_pipeline(stages: usize) -> anyhow::Result<Pipeline> {
    let mut text = String::from("name = \"chain\"\n");
    for i in 0..stages {
        let from = if i == 0 {
            "$input".to_string()
        } else {
            format!("s{}.out", i - 1)
        };
        text.push_str(&format!(
            "[[stage]]\nname = \"s{i}\"\nplugin = \"pass@^1\"\ninputs = {{ in = \"{from}\" }}\n"
        ));
    }
    Ok(Pipeline::parse("bench chain", &text)?)
}

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
                let bytes = format!("{client}-{i}").into_bytes();
                let artifact = ArtifactPut {
                    run_id: run.clone(),
                    stage: "raw".into(),
                    output: format!("o{client}-{i}"),
                    media_type: "application/octet-stream".into(),
                    digest: sha256_hex(&bytes),
                    bytes,
                    attempt: 1,
                    plugin_digest: None,
                    now: clock.now_ms(),
                };
                store
                    .raw_completion(RawCompletion { job_id, artifact })
                    .await?;
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
    let rig = rig(scratch, &format!("fanout_{stages}"), config.workers).await?;
    let text = fanout_pipeline(stages);
    let submitted = Instant::now();
    let pipeline = Pipeline::parse("bench fan-out", &text)?;
    let run = rig.submit(&pipeline, b"fan".to_vec()).await?;
    let submit_seconds = submitted.elapsed().as_secs_f64();
    drop((text, pipeline));
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
        "the fan-out run's audit: {:?}",
        report.violations
    );
    Ok(FanoutPoint {
        stages,
        submit_seconds,
        seconds: elapsed.as_secs_f64(),
        per_stage_us: elapsed.as_secs_f64() * 1e6 / (stages + 1) as f64,
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
