//! What every command opens once: the database, the clock, the plugin
//! host with its policy, cache and model backend.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::{BadInput, Cli, Command, ModelArgs, ModelKind};
use ratchet_runtime::client::Client;
use ratchet_runtime::clock::Clock;
use ratchet_runtime::llm::{ModelBackend, OpenAiConfig, OpenAiModel, StochasticModel};
use ratchet_runtime::plugin::{HostConfig, PluginHost, Policy};
use ratchet_runtime::scheduler::{Scheduler, SchedulerConfig};
use ratchet_runtime::store::Store;

/// Everything a command needs, opened once: the [`Client`] every command
/// goes through, and the parts of it they read often.
pub struct Env {
    pub db: String,
    /// The global options this process runs with, for a child `ratchet`
    /// process that must run the same way (the demo's crashing worker).
    pub global_args: Vec<std::ffi::OsString>,
    pub client: Client,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub host: Arc<PluginHost>,
    /// The policy's `[caps]`, for the runs this process submits.
    pub limits: ratchet_runtime::plugin::Caps,
}

impl Env {
    pub async fn open(cli: &Cli) -> Result<Self> {
        let db = cli.db.as_str();
        let config = host_config(cli)?;
        let model = model_backend(&cli.model)?;
        let mut builder = Client::builder(db).policy(config.policy).model(model);
        if let Some(dir) = config.cache_dir {
            builder = builder.cache_dir(dir);
        }
        if let Some(slots) = config.pooling {
            builder = builder.pooling(slots);
        }
        let client = builder.open().await.context("cannot open the database")?;
        Ok(Self {
            db: db.to_string(),
            global_args: cli.global_args(),
            store: client.store().clone(),
            clock: client.clock().clone(),
            host: client.host().clone(),
            limits: *client.limits(),
            client,
        })
    }

    pub fn scheduler(&self, worker_id: String, lease_ms: i64) -> Arc<Scheduler> {
        let mut config = SchedulerConfig::new(worker_id);
        config.lease_ms = lease_ms;
        self.client.scheduler(config)
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
    // (bench/benches/instantiate.rs); size it for the attempts a command
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
