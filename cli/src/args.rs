//! The command line's arguments and subcommands (clap).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
    /// Sinks file (TOML): where committed events are delivered. A worker
    /// with it relays beside its stages; `ratchet relay` needs it.
    #[arg(long, global = true, env = "RATCHET_SINKS")]
    pub sinks: Option<PathBuf>,
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
        if let Some(sinks) = &self.sinks {
            args.extend(["--sinks".into(), sinks.clone().into_os_string()]);
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
        /// Run the map-reduce example instead (`plugins/map-reduce.toml`):
        /// a map over a list, a join and an approval gate.
        #[arg(long, conflicts_with = "runs")]
        map_reduce: bool,
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
        /// Print `{"run_id": …, "created": …}` instead of the bare id.
        #[arg(long)]
        json: bool,
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
        /// Serve `GET /metrics` (Prometheus, docs/metrics.md) on this
        /// address, without a token; prints `metrics on http://ADDR/metrics`.
        #[arg(long)]
        metrics_listen: Option<std::net::SocketAddr>,
    },
    /// Deliver committed events to the sinks of `--sinks` until stopped
    /// (SIGTERM / Ctrl-C) or idle.
    Relay {
        /// Exit once every event is routed and no delivery to a sink of
        /// the file is pending.
        #[arg(long)]
        until_idle: bool,
        /// Recorded on delivery leases (default: host:pid).
        #[arg(long)]
        relay_id: Option<String>,
        /// How long a claimed delivery is owned: how long a dead relay's
        /// deliveries wait to be sent again. Above every sink's `timeout_ms`.
        #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
        lease_ms: u64,
    },
    /// List event deliveries (of one run, in one state), or redeliver dead
    /// letters.
    #[command(args_conflicts_with_subcommands = true)]
    Outbox {
        #[command(subcommand)]
        action: Option<OutboxCommand>,
        run: Option<String>,
        /// pending, delivered or dead
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List runs, or show one run's stages.
    Status {
        run: Option<String>,
        /// List each element of a mapped stage (by default, counts by
        /// state).
        #[arg(long)]
        elements: bool,
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
        /// The list, or the artifact's metadata and its text (null when
        /// the bytes are not UTF-8: use --raw), as JSON.
        #[arg(long, conflicts_with = "raw")]
        json: bool,
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
    /// Serve the HTTP API (docs/http-api.md) until SIGTERM or Ctrl-C; prints
    /// `listening on http://ADDR` once it accepts connections. Every request
    /// but `GET /health` must carry the bearer token in RATCHET_API_TOKEN
    /// (an environment variable, never an argument), which is required
    /// unless the address is loopback.
    Serve {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
    },
    /// Repair continuations that slipped (expired leases, edge counts) and
    /// reject approval gates whose timeout passed.
    Reconcile {
        #[arg(long)]
        json: bool,
    },
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
        /// Also measure the relay (scenario 8) against this NATS server
        /// with JetStream, in a scratch stream deleted afterwards.
        #[arg(long, env = "RATCHET_BENCH_NATS")]
        nats: Option<String>,
        /// Events the relay works off in scenario 8, and raw publishes.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        relay_events: Option<u64>,
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
    /// Stop a running run: nothing new starts in it, and an attempt in
    /// flight is fenced out (its result is discarded when it ends).
    Cancel {
        run: String,
        /// Why, recorded in the run's history.
        #[arg(long)]
        reason: Option<String>,
        /// Who cancels, recorded in the run's history [default: the OS user].
        #[arg(long)]
        by: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Resume a failed or cancelled run from the stages that did not
    /// succeed; succeeded stages keep their artifacts and do not run again.
    Retry {
        run: String,
        /// The stage to retry from (one that did not succeed); with
        /// `--fresh`, only its journal is discarded.
        #[arg(long)]
        stage: Option<String>,
        /// Discard the journaled model answers of the retried stages, so
        /// they ask the model again (by default they replay).
        #[arg(long)]
        fresh: bool,
        /// Who retries, recorded in the run's history [default: the OS user].
        #[arg(long)]
        by: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Approve an approval gate that awaits a decision: the stages after it
    /// run, and can read the decision as the gate's `decision` output.
    Approve {
        run: String,
        stage: String,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Reject an approval gate that awaits a decision: its run fails.
    Reject {
        run: String,
        stage: String,
        #[command(flatten)]
        decision: DecisionArgs,
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
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Validate and register a component.
    Add {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// List registered plugins.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show a plugin's versions: manifest, digest, size, runs using it.
    Show {
        /// NAME or NAME@VERSION
        plugin: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop new runs from resolving NAME@VERSION; pinned runs keep it.
    Yank {
        /// NAME@VERSION
        plugin: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Make dead letters pending again, under the same dedup key.
    Redeliver {
        /// The delivery's id (see `ratchet outbox --state dead`).
        id: Option<i64>,
        /// Every dead letter.
        #[arg(long, conflicts_with = "id")]
        dead: bool,
        #[arg(long)]
        json: bool,
    },
}

/// Who decides an approval gate, and why.
#[derive(Debug, clap::Args)]
pub struct DecisionArgs {
    /// A note kept in the decision.
    #[arg(long)]
    pub note: Option<String>,
    /// Who decides, kept in the decision [default: the OS user].
    #[arg(long)]
    pub by: Option<String>,
    #[arg(long)]
    pub json: bool,
}
