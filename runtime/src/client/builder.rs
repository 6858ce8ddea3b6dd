//! How a client is opened: the plugin policy, the model backend, the
//! component cache, the clock, and how often waits read the run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{Client, ENDED_BACKLOG, Inner, Result};
use crate::clock::{Clock, SystemClock};
use crate::llm::{ModelBackend, StochasticModel};
use crate::plugin::{HostConfig, PluginHost, Policy};
use crate::store::{self, SqliteStore, Store};

/// How [`Client::builder`] opens a client: the plugin policy, the model
/// backend, the component cache, the clock and how often waits poll.
pub struct ClientBuilder {
    url: String,
    policy: Policy,
    model: Arc<dyn ModelBackend>,
    clock: Arc<dyn Clock>,
    cache_dir: Option<PathBuf>,
    pooling: Option<u32>,
    poll: Duration,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &self.url)
            .finish()
    }
}

impl ClientBuilder {
    pub(super) fn new(url: String) -> Self {
        Self {
            url,
            policy: Policy::default(),
            model: Arc::new(StochasticModel),
            clock: Arc::new(SystemClock),
            cache_dir: None,
            pooling: None,
            poll: Duration::from_millis(200),
        }
    }

    /// The operator's policy (docs/configuration.md); the default admits
    /// every plugin with the default limits.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Where stages' model calls go; a seeded stand-in by default.
    pub fn model(mut self, model: Arc<dyn ModelBackend>) -> Self {
        self.model = model;
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Keep compiled components in this folder across restarts.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Preallocate instance slots for this many attempts at once.
    pub fn pooling(mut self, slots: u32) -> Self {
        self.pooling = Some(slots);
        self
    }

    /// How often [`Client::wait`] and [`Client::watch`] read a run's state
    /// (200 ms by default). On PostgreSQL a run's end wakes them at once,
    /// from any process; on SQLite, only from this client's own worker.
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// Opens the database (applying pending migrations) and the plugin host.
    pub async fn open(self) -> Result<Client> {
        // SQLite's store is kept as itself too, to lend its writer.
        let (store, sqlite): (Arc<dyn Store>, _) = if self.url.starts_with("sqlite:") {
            let sqlite = Arc::new(SqliteStore::open(&self.url).await?);
            (sqlite.clone(), Some(sqlite))
        } else {
            (store::open(&self.url).await?, None)
        };
        let caps = self.policy.plugin_caps();
        let limits = self.policy.caps;
        let config = HostConfig {
            policy: self.policy,
            cache_dir: self.cache_dir,
            pooling: self.pooling,
        };
        let host = PluginHost::new(store.clone(), self.model, self.clock.clone(), config)?;
        Ok(Client {
            inner: Arc::new(Inner {
                store,
                sqlite,
                host: Arc::new(host),
                clock: self.clock,
                caps,
                limits,
                poll: self.poll,
                changed: tokio::sync::watch::Sender::new(0),
                ended: tokio::sync::broadcast::Sender::new(ENDED_BACKLOG),
                listening: std::sync::OnceLock::new(),
            }),
        })
    }
}
