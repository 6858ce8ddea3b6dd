//! The `ratchet` command line. Bad input gets one line on stderr and exit
//! code 2; a failed audit exits 1.

mod bench;
mod demo;
mod inspect;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use crate::clock::{Clock, SystemClock};
use crate::manifest::{ManifestError, Pipeline};
use crate::model::{ModelBackend, OpenAiConfig, OpenAiModel, StochasticModel};
use crate::plugin::{HostConfig, PluginError, PluginHost, Policy};
use crate::registry::{self, RegistryError};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::store::{self, PluginPutOutcome, Store, StoreError};
use crate::worker::{self, WorkerOptions};

#[derive(Debug, Parser)]
#[command(
    name = "ratchet",
    version,
    about = "Durable pipelines of sandboxed Wasm stages"
)]
pub struct Cli {
    /// Database URL: sqlite://PATH (created if missing) or postgres://USER@HOST:PORT/DB.
    #[arg(
        long,
        global = true,
        env = "RATCHET_DB",
        default_value = "sqlite://ratchet.db"
    )]
    pub db: String,
    /// Operator policy (TOML): the capabilities plugins may be granted and
    /// caps on their limits. Without it every capability is grantable.
    #[arg(long, global = true, env = "RATCHET_POLICY")]
    pub policy: Option<PathBuf>,
    /// Folder for precompiled components [default: DB_FILE.components/ beside
    /// a SQLite database; none for PostgreSQL].
    #[arg(long, global = true, env = "RATCHET_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Every global option as given (or defaulted), as arguments.
    pub fn global_args(&self) -> Vec<std::ffi::OsString> {
        let m = &self.model;
        let backend = clap::ValueEnum::to_possible_value(&m.backend)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        let mut args: Vec<std::ffi::OsString> = vec![
            "--db".into(),
            self.db.clone().into(),
            "--model".into(),
            backend.into(),
            "--model-url".into(),
            m.model_url.clone().into(),
            "--model-name".into(),
            m.model_name.clone().into(),
            "--model-timeout-ms".into(),
            m.model_timeout_ms.to_string().into(),
        ];
        if let Some(policy) = &self.policy {
            args.extend(["--policy".into(), policy.clone().into_os_string()]);
        }
        if let Some(dir) = &self.cache_dir {
            args.extend(["--cache-dir".into(), dir.clone().into_os_string()]);
        }
        args
    }
}

/// The backend behind `model.generate`.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// `stochastic` (built in, random answers) or `openai` (any
    /// OpenAI-compatible chat-completions server).
    #[arg(
        long = "model",
        global = true,
        env = "RATCHET_MODEL",
        default_value = "stochastic"
    )]
    pub backend: ModelKind,
    /// Base URL of the OpenAI-compatible API, up to the version.
    #[arg(
        long,
        global = true,
        env = "RATCHET_MODEL_URL",
        default_value = "https://api.openai.com/v1"
    )]
    pub model_url: String,
    #[arg(
        long,
        global = true,
        env = "RATCHET_MODEL_NAME",
        default_value = "gpt-4o-mini"
    )]
    pub model_name: String,
    /// Per request, connect to last byte.
    #[arg(
        long,
        global = true,
        env = "RATCHET_MODEL_TIMEOUT_MS",
        default_value_t = 60_000
    )]
    pub model_timeout_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelKind {
    Stochastic,
    Openai,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Register the bundled plugins, run the demo pipeline through a real
    /// worker crash, and tell what happened.
    Demo {
        /// How many runs of the demo pipeline to submit.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
        runs: u32,
    },
    /// Manage registered plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Submit a run of a pipeline file; prints the run id.
    Run {
        pipeline: PathBuf,
        /// File whose bytes become the run's `$input`.
        #[arg(long)]
        input: Option<PathBuf>,
        /// Submitting twice with one key creates one run.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Claim and run stages until stopped (SIGTERM / Ctrl-C) or idle.
    Worker {
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
        concurrency: u32,
        /// Exit once no stage is ready or running.
        #[arg(long)]
        until_idle: bool,
        /// How long a claim is owned unless renewed (every third of it, while
        /// the attempt runs): how long a dead worker's jobs wait to be taken over.
        #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..))]
        lease_ms: u64,
        /// Recorded on leases and attempts (default: host:pid).
        #[arg(long)]
        worker_id: Option<String>,
        /// After a stop signal, how long in-flight attempts may finish.
        #[arg(long, default_value_t = 30)]
        grace_secs: u64,
    },
    /// List runs, or show one run's stages.
    Status {
        run: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List a run's artifacts, or print one.
    Artifacts {
        run: String,
        /// STAGE.OUTPUT
        artifact: Option<String>,
        /// Write the artifact's exact bytes to stdout.
        #[arg(long, requires = "artifact")]
        raw: bool,
    },
    /// Check the three invariants over the whole database, one run at a
    /// time (progress on stderr when it is a terminal), or over one run.
    Audit {
        /// Audit only this run.
        #[arg(long)]
        run: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Repair continuations that slipped (expired leases, edge counts).
    Reconcile,
    /// Measure Ratchet against the raw limit of its database, in one run
    /// (scratch databases; `--db` is not touched). See BENCHMARKS.md.
    Bench {
        /// Every scenario at a small size, in seconds (what CI runs).
        #[arg(long)]
        smoke: bool,
        /// Also measure on this PostgreSQL server, in scratch schemas that
        /// are dropped afterwards.
        #[arg(long, env = "RATCHET_BENCH_POSTGRES")]
        postgres: Option<String>,
        /// Runs of the chain pipeline (scenarios 2 and 5); by default as
        /// many as the Wasm chain burns down in 10 s.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        runs: Option<u64>,
        /// Stages per chain run.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
        chain: Option<u64>,
        /// Worker tasks, and clients for the raw limit.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
        workers: Option<u64>,
        /// Stages of the large fan-out (the small one is a tenth).
        #[arg(long, value_parser = clap::value_parser!(u64).range(10..=100_000))]
        fanout: Option<u64>,
        /// Print JSON keyed by backend instead of a table.
        #[arg(long)]
        json: bool,
        /// Only scenario 6: the fan-out sizes Obelisk was measured at.
        #[arg(long)]
        peer: bool,
        /// Runs of each size in scenario 6 (the median is reported).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
        peer_runs: Option<u64>,
    },
    /// Pin a stage of a running run that has not started yet to another
    /// registered version of its plugin.
    Upgrade {
        run: String,
        #[arg(long)]
        stage: String,
        /// The exact version, e.g. 1.2.0.
        #[arg(long)]
        to: semver::Version,
    },
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Validate and register a component.
    Add { file: PathBuf },
    /// List registered plugins.
    List,
    /// Show a plugin's versions: manifest, digest, size, runs using it.
    Show {
        /// NAME or NAME@VERSION
        plugin: String,
    },
    /// Stop new runs from resolving NAME@VERSION; pinned runs keep it.
    Yank {
        /// NAME@VERSION
        plugin: String,
    },
}

/// An error in what the user gave us (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let rendered = e.render().to_string();
            let first = rendered
                .lines()
                .next()
                .unwrap_or("error: invalid arguments");
            eprintln!("{first} (see `ratchet --help`)");
            return ExitCode::from(2);
        }
    };
    let default_level = if matches!(cli.command, Command::Worker { .. }) {
        "info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RATCHET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colour only for a terminal, and never when NO_COLOR is set
    // (no-color.org: any value but the empty string).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    if let Err(e) = crate::crash::setup_from_env() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}

fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

fn exit_code(e: &anyhow::Error) -> u8 {
    let plugin_input = |p: &PluginError| {
        matches!(
            p,
            PluginError::InvalidComponent(_)
                | PluginError::WrongWorld(_)
                | PluginError::Manifest(_)
                | PluginError::NotAdmitted(_)
        )
    };
    let store_input = |s: &StoreError| {
        matches!(
            s,
            StoreError::UnsupportedUrl(_) | StoreError::VersionConflict { .. }
        )
    };
    let bad_input = e.chain().any(|c| {
        c.is::<BadInput>()
            || c.is::<ManifestError>()
            || c.downcast_ref::<StoreError>().is_some_and(store_input)
            || c.downcast_ref::<PluginError>().is_some_and(plugin_input)
            || match c.downcast_ref::<RegistryError>() {
                Some(RegistryError::Manifest(_) | RegistryError::Refused(_)) => true,
                Some(RegistryError::Plugin(p)) => plugin_input(p),
                Some(RegistryError::Store(s)) => store_input(s),
                None => false,
            }
    });
    if bad_input { 2 } else { 1 }
}

/// Everything a command needs, opened once.
pub struct Env {
    pub db: String,
    /// The global options this process runs with, for a child `ratchet`
    /// process that must run the same way (the demo's crashing worker).
    pub global_args: Vec<std::ffi::OsString>,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub host: Arc<PluginHost>,
}

impl Env {
    pub async fn open(cli: &Cli) -> Result<Self> {
        let db = cli.db.as_str();
        let config = host_config(cli)?;
        let model = model_backend(&cli.model)?;
        let store = store::open(db).await.context("cannot open the database")?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let host = Arc::new(PluginHost::new(
            store.clone(),
            model,
            clock.clone(),
            config,
        )?);
        Ok(Self {
            db: db.to_string(),
            global_args: cli.global_args(),
            store,
            clock,
            host,
        })
    }

    pub fn scheduler(&self, worker_id: String, lease_ms: i64) -> Arc<Scheduler> {
        let mut config = SchedulerConfig::new(worker_id);
        config.lease_ms = lease_ms;
        Arc::new(Scheduler::new(
            self.store.clone(),
            self.host.clone(),
            self.clock.clone(),
            config,
        ))
    }
}

fn host_config(cli: &Cli) -> Result<HostConfig> {
    let policy = match &cli.policy {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                BadInput(format!("cannot read the policy `{}`: {e}", path.display()))
            })?;
            Policy::parse(&path.display().to_string(), &text)?
        }
        None => Policy::default(),
    };
    let cache_dir = cli.cache_dir.clone().or_else(|| {
        let path = cli
            .db
            .strip_prefix("sqlite://")
            .or_else(|| cli.db.strip_prefix("sqlite:"))?
            .split('?')
            .next()?;
        (!path.is_empty() && !path.contains(":memory:"))
            .then(|| PathBuf::from(format!("{path}.components")))
    });
    // The pooling allocator halves the per-attempt cost of instantiating
    // (runtime/benches/instantiate.rs); size it for the attempts a command
    // runs at once, with room for `describe` calls while plugins load.
    let pooling = match &cli.command {
        Command::Worker { concurrency, .. } => Some(concurrency.saturating_mul(2) + 16),
        Command::Demo { .. } => Some(32),
        _ => None,
    };
    Ok(HostConfig {
        policy,
        cache_dir,
        pooling,
    })
}

fn model_backend(args: &ModelArgs) -> Result<Arc<dyn ModelBackend>> {
    Ok(match args.backend {
        ModelKind::Stochastic => Arc::new(StochasticModel),
        ModelKind::Openai => {
            let api_key = std::env::var("RATCHET_MODEL_API_KEY")
                .or_else(|_| std::env::var("OPENAI_API_KEY"))
                .ok()
                .filter(|k| !k.is_empty());
            let config = OpenAiConfig {
                base_url: args.model_url.clone(),
                model: args.model_name.clone(),
                api_key,
                timeout: Duration::from_millis(args.model_timeout_ms),
            };
            Arc::new(OpenAiModel::new(config).map_err(|e| BadInput(e.to_string()))?)
        }
    })
}

pub fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", std::process::id())
}

async fn dispatch(cli: Cli) -> Result<ExitCode> {
    if let Command::Bench {
        smoke,
        postgres,
        runs,
        chain,
        workers,
        fanout,
        json,
        peer,
        peer_runs,
    } = &cli.command
    {
        let size = |v: &Option<u64>| v.map(|v| v as usize);
        let args = bench::BenchArgs {
            smoke: *smoke,
            postgres: postgres.clone(),
            runs: size(runs),
            chain: size(chain),
            workers: size(workers),
            fanout: size(fanout),
            json: *json,
            peer: *peer,
            peer_runs: size(peer_runs),
        };
        return bench::run(args).await;
    }
    if let Command::Plugin(PluginCommand::Add { file }) = &cli.command {
        // Read the file before opening (and perhaps creating) the database.
        if !file.is_file() {
            return Err(BadInput(format!("cannot read `{}`: no such file", file.display())).into());
        }
    }
    let env = Env::open(&cli).await?;
    match cli.command {
        Command::Demo { runs } => demo::run(&env, runs).await,
        Command::Plugin(PluginCommand::Add { file }) => {
            let bytes = std::fs::read(&file)
                .map_err(|e| BadInput(format!("cannot read `{}`: {e}", file.display())))?;
            let registered =
                registry::plugin_register(&env.store, &env.host, bytes, env.clock.as_ref())
                    .await
                    .with_context(|| format!("`{}` was not registered", file.display()))?;
            let verb = match registered.outcome {
                PluginPutOutcome::Inserted => "registered",
                PluginPutOutcome::AlreadyPresent => "already registered",
            };
            println!(
                "{verb} {}@{} ({})",
                registered.manifest.name, registered.manifest.version, registered.digest
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::List) => inspect::plugin_list(&env).await,
        Command::Plugin(PluginCommand::Show { plugin }) => {
            inspect::plugin_show(&env, &plugin).await
        }
        Command::Plugin(PluginCommand::Yank { plugin }) => {
            let (name, version) = registry::parse_plugin_spec(&plugin)?;
            let Some(version) = version else {
                return Err(BadInput(format!(
                    "name the version to yank: `ratchet plugin yank {name}@VERSION`"
                ))
                .into());
            };
            registry::plugin_versions(env.store.as_ref(), &name, Some(&version)).await?;
            env.store.plugin_yank(&name, &version.to_string()).await?;
            println!(
                "yanked {name}@{version}: new runs no longer resolve it; runs pinned to it keep it"
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            pipeline,
            input,
            idempotency_key,
        } => {
            let text = std::fs::read_to_string(&pipeline)
                .map_err(|e| BadInput(format!("cannot read `{}`: {e}", pipeline.display())))?;
            let parsed = Pipeline::parse(&pipeline.display().to_string(), &text)?;
            let input = match input {
                Some(path) => std::fs::read(&path).map_err(|e| {
                    BadInput(format!("cannot read input `{}`: {e}", path.display()))
                })?,
                None => Vec::new(),
            };
            let outcome = registry::run_submit(
                env.store.as_ref(),
                &parsed,
                input,
                idempotency_key,
                env.clock.as_ref(),
            )
            .await?;
            println!("{}", outcome.run_id());
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker {
            concurrency,
            until_idle,
            lease_ms,
            worker_id,
            grace_secs,
        } => {
            let worker_id = worker_id.unwrap_or_else(default_worker_id);
            let sched = env.scheduler(worker_id.clone(), lease_ms as i64);
            let opts = WorkerOptions {
                concurrency: concurrency as usize,
                until_idle,
                ..WorkerOptions::default()
            };
            let stop_signal = shutdown_signal()?;
            tracing::info!(worker = %worker_id, concurrency, "worker started");
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let mut work = tokio::spawn(worker::run(sched, env.clock.clone(), opts, stopped));
            let stats = tokio::select! {
                joined = &mut work => joined??,
                _ = stop_signal => {
                    tracing::info!("stopping: letting in-flight attempts finish (up to {grace_secs} s)");
                    let _ = stop.send(true);
                    match tokio::time::timeout(Duration::from_secs(grace_secs), &mut work).await {
                        Ok(joined) => joined??,
                        Err(_) => {
                            work.abort();
                            tracing::warn!("abandoned in-flight attempts; their leases will expire and they will be retried");
                            return Ok(ExitCode::SUCCESS);
                        }
                    }
                }
            };
            tracing::info!("worker stopped: {}", stats.summary());
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { run, json } => inspect::status(&env, run.as_deref(), json).await,
        Command::Artifacts { run, artifact, raw } => {
            inspect::artifacts(&env, &run, artifact.as_deref(), raw).await
        }
        Command::Audit { run, json } => inspect::audit(&env, run.as_deref(), json).await,
        Command::Upgrade { run, stage, to } => {
            let digest =
                registry::stage_upgrade(env.store.as_ref(), &run, &stage, &to, env.clock.as_ref())
                    .await?;
            println!("stage `{stage}` of run {run} now runs version {to} ({digest})");
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { .. } => Err(anyhow::anyhow!(
            "`bench` runs on scratch databases and is dispatched before `--db` is opened"
        )),
        Command::Reconcile => {
            let report = env.store.reconcile(env.clock.now_ms()).await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// SIGTERM and Ctrl-C, with handlers installed when this returns (before the
/// worker says it started), so an early signal is never the default "die".
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    let ctrl_c = tokio::signal::ctrl_c();
    Ok(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
    })
}
