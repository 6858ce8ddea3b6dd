//! The Wasm sandbox: one wasmtime engine, components compiled once per digest
//! (kept in memory and precompiled on disk), a fresh instance per attempt
//! with a deadline, a memory cap and no ambient authority. A plugin can fail
//! an attempt; it cannot take the host down.

mod cache;
mod contract;
mod host;
mod limits;
mod policy;
mod replay;
mod world;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, InstanceAllocationStrategy, Store as WasmStore, UpdateDeadline};
use wasmtime_wasi::WasiCtx;

use crate::clock::Clock;
use crate::digest::sha256_hex;
use crate::llm::{ModelBackend, Usage};
use crate::lock;
use crate::manifest::{ManifestError, PluginManifest};
use crate::store::{Catalog, Store, StoreError};
use crate::text::escape_controls;

pub use crate::graph::Payload;
pub use cache::DiskCache;
pub use host::HostFailure;
pub use policy::{
    Caps, DEFAULT_MAX_HOST_CALLS, DEFAULT_MAX_HTTP_RESPONSE_BYTES, DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_MS, EffectiveLimits, Policy, SecretGrant,
};
pub use world::Contract;

/// An output as the stage proposed it, before the contract check.
pub(crate) struct Proposal {
    pub name: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// How a stage's own `run` said it failed.
pub(crate) enum StageFailure {
    Retryable(String),
    Fatal(String),
}

const EPOCH_TICK: Duration = Duration::from_millis(5);

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(
        "not a valid Wasm component: {0} (build it for wasm32-wasip2, see plugin-sdk/README.md)"
    )]
    InvalidComponent(String),
    #[error("the component does not implement Ratchet's `stage` world: {0}")]
    WrongWorld(String),
    #[error("the component's manifest is invalid: {0}")]
    Manifest(#[from] ManifestError),
    #[error("plugin {0} is not registered")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("wasm engine error: {0}")]
    Engine(String),
    /// The operator's policy does not admit the plugin.
    #[error("{0}")]
    NotAdmitted(String),
}

impl PluginError {
    /// Whether the component itself is at fault (not a Wasm component,
    /// the wrong world, a bad manifest, refused by the policy): sending
    /// the same bytes again fails the same way.
    pub fn is_bad_component(&self) -> bool {
        matches!(
            self,
            PluginError::InvalidComponent(_)
                | PluginError::WrongWorld(_)
                | PluginError::Manifest(_)
                | PluginError::NotAdmitted(_)
        )
    }
}

/// Why an attempt failed inside the sandbox, and whether a retry may help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("stage failed (retryable): {0}")]
    Retryable(String),
    #[error("stage failed (fatal): {0}")]
    Fatal(String),
    #[error("stage trapped: {0}")]
    Trap(String),
    #[error("stage exceeded its {0} ms deadline")]
    Timeout(u64),
    #[error("stage exceeded its memory limit of {0} MiB")]
    OutOfMemory(u64),
    #[error("stage broke its output contract: {0}")]
    Contract(String),
    #[error("{0}")]
    Host(HostFailure),
    /// The database refused to store the attempt's result (not a passing
    /// fault of the connection): only this attempt fails.
    #[error("the store refused the attempt's result: {0}")]
    Refused(String),
}

impl ExecError {
    pub fn is_retryable(&self) -> bool {
        match self {
            ExecError::Retryable(_)
            | ExecError::Trap(_)
            | ExecError::Timeout(_)
            | ExecError::Refused(_) => true,
            ExecError::Fatal(_) | ExecError::Contract(_) | ExecError::OutOfMemory(_) => false,
            ExecError::Host(h) => h.is_retryable(),
        }
    }
}

/// A component ready to instantiate, with its validated manifest.
pub struct LoadedPlugin {
    pub digest: String,
    pub manifest: PluginManifest,
    /// The component's imports, e.g. `ratchet:stage/model@0.2.0`.
    pub imports: Vec<String>,
    pre: world::StagePre,
}

impl LoadedPlugin {
    /// The version of Ratchet's contract the component speaks.
    pub fn contract(&self) -> Contract {
        self.pre.contract()
    }
}

/// How a `PluginHost` is set up; `HostConfig::default()` suits tests and the
/// demo.
#[derive(Debug, Clone, Default)]
pub struct HostConfig {
    pub policy: Policy,
    /// Where precompiled components are kept across restarts; `None` keeps
    /// them in memory only.
    pub cache_dir: Option<PathBuf>,
    /// Instance slots for wasmtime's pooling allocator (at least the number
    /// of attempts run at once); `None` allocates each instance on demand.
    pub pooling: Option<u32>,
}

/// How components were obtained since the host started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Compiled from Wasm with cranelift.
    pub compiled: u64,
    /// Loaded precompiled from the disk cache.
    pub from_disk: u64,
}

/// Who is calling and with what: the host side of one attempt.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub run_id: String,
    pub stage: String,
    pub attempt: i64,
    pub idempotency_key: String,
    /// When the stage's first attempt was claimed (ms since the Unix
    /// epoch): the guest's wall clock starts there on every attempt.
    pub started_at_ms: i64,
}

/// What the host tells about an attempt besides its outputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecReport {
    /// The plugin's name, once it was loaded (metrics label attempts by it).
    pub plugin: String,
    pub model_calls_replayed: u32,
    pub model_calls_fresh: u32,
    /// The tokens of the fresh calls' answers, as their backend counted
    /// them (replayed answers cost nothing again).
    pub model_tokens: Usage,
    /// `log` calls dropped because the attempt was not granted `log`.
    pub log_lines_dropped: u32,
    /// HTTP requests sent by this attempt, and answered from the journal.
    pub http_calls_fresh: u32,
    pub http_calls_replayed: u32,
    /// HTTP requests refused before anything was sent (a host or a secret
    /// not allowed, or `http` not granted).
    pub http_requests_denied: u32,
}

pub struct HostState {
    wasi: WasiCtx,
    http: wasmtime_wasi_http::WasiHttpCtx,
    no_http: host::NoHttp,
    table: ResourceTable,
    limits: limits::InstanceLimits,
    call: Option<host::CallContext>,
}

/// Engine, linker and component cache shared by every worker task.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<HostState>,
    policy: Policy,
    cache: Mutex<HashMap<String, Arc<LoadedPlugin>>>,
    disk: Option<DiskCache>,
    compiled: AtomicU64,
    from_disk: AtomicU64,
    catalog: Arc<dyn Catalog>,
    services: host::Services,
    stop_ticker: Arc<AtomicBool>,
}

impl Drop for PluginHost {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
    }
}

impl PluginHost {
    pub fn new(
        store: Arc<dyn Store>,
        model: Arc<dyn ModelBackend>,
        clock: Arc<dyn Clock>,
        host_config: HostConfig,
    ) -> Result<Self, PluginError> {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true).epoch_interruption(true);
        if let Some(slots) = host_config.pooling {
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(limits::pooling(
                slots,
                host_config.policy.caps.memory_mb,
            )));
        }
        let engine = Engine::new(&config).map_err(|e| PluginError::Engine(e.to_string()))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| PluginError::Engine(e.to_string()))?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| PluginError::Engine(e.to_string()))?;
        world::add_to_linker(&mut linker).map_err(|e| PluginError::Engine(e.to_string()))?;
        let stop_ticker = Arc::new(AtomicBool::new(false));
        let (ticker_engine, stop) = (engine.clone(), stop_ticker.clone());
        std::thread::Builder::new()
            .name("ratchet-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    ticker_engine.increment_epoch();
                }
            })
            .map_err(|e| PluginError::Engine(e.to_string()))?;
        let disk = host_config
            .cache_dir
            .map(|dir| DiskCache::new(dir, &engine));
        let services = host::Services::new(store.clone(), model, clock, &host_config.policy)
            .map_err(|e| PluginError::Engine(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            engine,
            linker,
            policy: host_config.policy,
            cache: Mutex::new(HashMap::new()),
            disk,
            compiled: AtomicU64::new(0),
            from_disk: AtomicU64::new(0),
            catalog: store,
            services,
            stop_ticker,
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The disk cache of precompiled components, when configured.
    pub fn disk_cache(&self) -> Option<&DiskCache> {
        self.disk.as_ref()
    }

    pub fn compile_stats(&self) -> CompileStats {
        CompileStats {
            compiled: self.compiled.load(Ordering::Relaxed),
            from_disk: self.from_disk.load(Ordering::Relaxed),
        }
    }

    /// Checks a component the way `plugin add` does before anything is
    /// stored: it compiles, implements `stage`, describes a valid manifest,
    /// and the operator's policy admits its imports, capabilities and limits.
    pub async fn admit(&self, bytes: &[u8]) -> Result<Arc<LoadedPlugin>, PluginError> {
        let loaded = self.inspect(bytes).await?;
        self.policy
            .admit(&loaded.manifest, &loaded.imports)
            .map_err(|refusal| PluginError::NotAdmitted(escape_controls(&refusal).into_owned()))?;
        Ok(loaded)
    }

    /// Compiles a component (or loads it precompiled) and reads its manifest
    /// through `describe`.
    pub async fn inspect(&self, bytes: &[u8]) -> Result<Arc<LoadedPlugin>, PluginError> {
        let digest = sha256_hex(bytes);
        if let Some(hit) = self.cached(&digest) {
            return Ok(hit);
        }
        let (component, fresh) = self.compile(&digest, bytes).await?;
        let imports = component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect::<Vec<_>>();
        // Said before linking fails on it, in Ratchet's words.
        let refused =
            |refusal: String| PluginError::NotAdmitted(escape_controls(&refusal).into_owned());
        let contract = Contract::of(&imports).map_err(refused)?;
        if let Some(refusal) = policy::unprovided_import(&imports) {
            return Err(refused(refusal));
        }
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| PluginError::WrongWorld(first_line(&e)))?;
        let pre = world::StagePre::new(contract, instance_pre)
            .map_err(|e| PluginError::WrongWorld(first_line(&e)))?;
        let text = self.describe(&pre).await?;
        let manifest =
            PluginManifest::parse(&format!("manifest of component {}", &digest[..12]), &text)?;
        if fresh && let Some(disk) = &self.disk {
            // A cache that cannot be written costs a recompile next start,
            // nothing more.
            if let Err(e) = disk.store(&digest, &component) {
                tracing::warn!(%digest, "cannot keep the precompiled component: {e}");
            }
        }
        let loaded = Arc::new(LoadedPlugin {
            digest: digest.clone(),
            manifest,
            imports,
            pre,
        });
        lock(&self.cache).insert(digest, loaded.clone());
        Ok(loaded)
    }

    /// The component from the disk cache, or compiled (`true`: freshly).
    async fn compile(&self, digest: &str, bytes: &[u8]) -> Result<(Component, bool), PluginError> {
        let engine = self.engine.clone();
        let disk = self.disk.clone();
        let (digest, owned) = (digest.to_string(), bytes.to_vec());
        let (component, fresh) = tokio::task::spawn_blocking(move || {
            if let Some(hit) = disk.and_then(|d| d.load(&engine, &digest)) {
                return Ok((hit, false));
            }
            Component::new(&engine, &owned).map(|c| (c, true))
        })
        .await
        .map_err(|e| PluginError::Engine(e.to_string()))?
        .map_err(|e| PluginError::InvalidComponent(first_line(&e)))?;
        let counter = if fresh {
            &self.compiled
        } else {
            &self.from_disk
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok((component, fresh))
    }

    /// The registered plugin with this digest, compiled once and cached. It
    /// runs under the manifest admitted at registration, never under what
    /// its `describe` says now: a component that describes itself otherwise
    /// than when it was admitted is refused.
    pub async fn load(&self, digest: &str) -> Result<Arc<LoadedPlugin>, PluginError> {
        if let Some(hit) = self.cached(digest) {
            return Ok(hit);
        }
        let record = self
            .catalog
            .plugin_get(digest)
            .await?
            .ok_or_else(|| PluginError::Unknown(digest.to_string()))?;
        let admitted = PluginManifest::parse(
            &format!("registered manifest of {}", &digest[..digest.len().min(12)]),
            &record.summary.manifest,
        )?;
        let loaded = self.inspect(&record.component).await?;
        if loaded.manifest != admitted {
            lock(&self.cache).remove(digest);
            return Err(PluginError::WrongWorld(format!(
                "`describe` now returns another manifest than the one admitted when {}@{} was registered; the component is not deterministic and is not run (register a fixed version)",
                admitted.name, admitted.version
            )));
        }
        Ok(loaded)
    }

    fn cached(&self, digest: &str) -> Option<Arc<LoadedPlugin>> {
        lock(&self.cache).get(digest).cloned()
    }

    /// A store for one instance. With an attempt, WASI's clocks and random
    /// numbers replay across its stage's attempts ([`replay`]).
    fn new_store(
        &self,
        limits: limits::InstanceLimits,
        call: Option<host::CallContext>,
        timeout: Duration,
    ) -> WasmStore<HostState> {
        let mut wasi = WasiCtx::builder();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let Some(call) = &call {
            replay::install(&mut wasi, call.invocation());
        }
        let wasi = wasi.build();
        let state = HostState {
            wasi,
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            no_http: host::NoHttp,
            table: ResourceTable::new(),
            limits,
            call,
        };
        let mut store = WasmStore::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        let deadline = Instant::now() + timeout;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store
    }

    async fn describe(&self, pre: &world::StagePre) -> Result<String, PluginError> {
        let limits = limits::InstanceLimits::new((DEFAULT_MEMORY_MB * 1024 * 1024) as usize);
        let timeout = Duration::from_millis(DEFAULT_TIMEOUT_MS);
        let mut store = self.new_store(limits, None, timeout);
        match tokio::time::timeout(timeout, pre.describe(&mut store)).await {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(e)) => Err(PluginError::WrongWorld(format!(
                "`describe` failed: {}",
                first_line(&e)
            ))),
            Err(_) => Err(PluginError::WrongWorld(
                "`describe` did not return in time".into(),
            )),
        }
    }

    /// Runs one attempt: a fresh instance, canonical inputs in, proposed
    /// outputs out, checked against the manifest.
    pub async fn execute(
        &self,
        plugin: &LoadedPlugin,
        inv: &Invocation,
        inputs: Vec<Payload>,
    ) -> Result<(Vec<Payload>, ExecReport), (ExecError, ExecReport)> {
        let limits = self.policy.limits(&plugin.manifest.limits);
        let timeout_ms = limits.timeout_ms;
        let memory = limits.memory_mb * 1024 * 1024;
        // One budget for all the instance's memories together.
        let store_limits =
            limits::InstanceLimits::new(usize::try_from(memory).unwrap_or(usize::MAX));
        let call = host::CallContext::new(
            inv.clone(),
            &plugin.manifest,
            &limits,
            &self.policy,
            &self.services,
        );
        let timeout = Duration::from_millis(timeout_ms);
        let mut store = self.new_store(store_limits, Some(call), timeout);
        let run = plugin.pre.run(&mut store, inv, inputs);
        // The epoch callback interrupts a guest past its deadline; this outer
        // bound also covers a host call (a model request) that hangs.
        let outcome = tokio::time::timeout(timeout + Duration::from_secs(1), run).await;
        let call = store.data_mut().call.take();
        let report = call.as_ref().map(|c| c.report()).unwrap_or_default();
        if let Some(failure) = call.and_then(|c| c.failure.take()) {
            return Err((ExecError::Host(failure), report));
        }
        let result = match outcome {
            Err(_) => Err(ExecError::Timeout(timeout_ms)),
            Ok(Err(e)) => Err(classify_trap(&e, timeout_ms, memory >> 20)),
            Ok(Ok(Err(StageFailure::Retryable(m)))) => Err(ExecError::Retryable(m)),
            Ok(Ok(Err(StageFailure::Fatal(m)))) => Err(ExecError::Fatal(m)),
            Ok(Ok(Ok(outputs))) => contract::check_outputs(&plugin.manifest, &limits, outputs),
        };
        result.map(|o| (o, report.clone())).map_err(|e| (e, report))
    }
}

fn classify_trap(e: &wasmtime::Error, timeout_ms: u64, memory_mb: u64) -> ExecError {
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return ExecError::Timeout(timeout_ms);
    }
    // The limiter ends a memory bomb with this error, which is not a `Trap`.
    if format!("{e:#}").contains(limits::OUT_OF_MEMORY) {
        return ExecError::OutOfMemory(memory_mb);
    }
    ExecError::Trap(first_line(e))
}

/// The first line of a wasmtime error, which may quote the component's own
/// names: control characters escaped.
fn first_line(e: &wasmtime::Error) -> String {
    let text = format!("{e:#}");
    escape_controls(text.lines().next().unwrap_or_default()).into_owned()
}
