//! What every scenario stands on: a scratch database, the bench plugins
//! registered in it, a host, and schedulers with the Wasm executor or the
//! native one.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::lock;
use ratchet_runtime::bundled::BENCH_PLUGINS;
use ratchet_runtime::clock::{Clock, SystemClock};
use ratchet_runtime::llm::StochasticModel;
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::plugin::{
    Caps, ExecError, ExecReport, HostConfig, Invocation, Payload, PluginHost,
};
use ratchet_runtime::registry;
use ratchet_runtime::scheduler::{Scheduler, SchedulerConfig, SchedulerProbe, StageExecutor};
use ratchet_runtime::store::{self, MeasuredStore, PostgresStore, StoreError};
use ratchet_runtime::worker::{self, WorkerOptions};

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
    pub(crate) async fn database(&self, name: &str) -> anyhow::Result<Arc<dyn MeasuredStore>> {
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
pub(crate) struct Rig {
    pub(crate) store: Arc<dyn MeasuredStore>,
    pub(crate) host: Arc<PluginHost>,
    pub(crate) clock: Arc<dyn Clock>,
}

pub(crate) async fn rig(scratch: &Scratch, name: &str, workers: usize) -> anyhow::Result<Rig> {
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
    pub(crate) fn scheduler(
        &self,
        native: bool,
        probe: Option<Arc<dyn SchedulerProbe>>,
    ) -> Arc<Scheduler> {
        let executor: Arc<dyn StageExecutor> = if native {
            Arc::new(NativePass)
        } else {
            self.host.clone()
        };
        Arc::new(Scheduler::observed(
            self.store.clone(),
            executor,
            self.clock.clone(),
            SchedulerConfig::new("bench"),
            probe,
        ))
    }

    pub(crate) async fn submit(
        &self,
        pipeline: &Pipeline,
        input: Vec<u8>,
    ) -> anyhow::Result<String> {
        let outcome = registry::run_submit(
            self.store.as_ref(),
            pipeline,
            input,
            None,
            &Caps::default(),
            self.clock.as_ref(),
        )
        .await?;
        Ok(outcome.run_id().to_string())
    }

    /// Submits the chain runs numbered `runs`, a few at a time (on Postgres
    /// they commit in parallel).
    pub(crate) async fn submit_many(
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
                    registry::run_submit(
                        store.as_ref(),
                        &pipeline,
                        input,
                        None,
                        &Caps::default(),
                        clock.as_ref(),
                    )
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
    pub(crate) async fn burn_down(
        &self,
        sched: Arc<Scheduler>,
        workers: usize,
    ) -> anyhow::Result<Duration> {
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
            // A new payload, its digest computed, as any executor's outputs.
            .map(|p| Payload::new("out", p.media_type, p.bytes))
            .collect();
        Ok((Ok(outputs), ExecReport::default()))
    }

    fn longest_attempt_ms(&self) -> u64 {
        u64::MAX
    }
}

pub(crate) fn chain_pipeline(stages: usize) -> anyhow::Result<Pipeline> {
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
