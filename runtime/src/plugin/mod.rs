//! The Wasm sandbox: one wasmtime engine, components compiled once per digest,
//! a fresh instance per attempt with a deadline, a memory cap and no ambient
//! authority. A plugin can fail an attempt; it cannot take the host down.

mod host;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store as WasmStore, StoreLimits, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::WasiCtx;

use crate::clock::Clock;
use crate::digest::sha256_hex;
use crate::manifest::{Capability, ManifestError, PluginManifest};
use crate::model::ModelBackend;
use crate::store::{Store, StoreError};

pub use host::HostFailure;

wasmtime::component::bindgen!({
    world: "stage",
    path: "../plugin-sdk/wit",
    imports: { default: async | trappable },
    exports: { default: async },
});

use ratchet::stage::types::Artifact as WitArtifact;

/// Defaults for limits a manifest leaves unset.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_MEMORY_MB: u64 = 256;
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;
pub const DEFAULT_MAX_HOST_CALLS: u64 = 100_000;
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
}

impl ExecError {
    pub fn is_retryable(&self) -> bool {
        match self {
            ExecError::Retryable(_) | ExecError::Trap(_) | ExecError::Timeout(_) => true,
            ExecError::Fatal(_) | ExecError::Contract(_) | ExecError::OutOfMemory(_) => false,
            ExecError::Host(h) => h.is_retryable(),
        }
    }
}

/// A component ready to instantiate, with its validated manifest.
pub struct LoadedPlugin {
    pub digest: String,
    pub manifest: PluginManifest,
    pre: StagePre<HostState>,
}

/// Who is calling and with what: the host side of one attempt.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub run_id: String,
    pub stage: String,
    pub attempt: i64,
    pub idempotency_key: String,
}

/// One named artifact crossing the sandbox boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub name: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// What the host tells about an attempt besides its outputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecReport {
    pub model_calls_replayed: u32,
    pub model_calls_fresh: u32,
}

pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    call: Option<host::CallContext>,
}

/// Engine, linker and component cache shared by every worker task.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<HostState>,
    cache: Mutex<HashMap<String, Arc<LoadedPlugin>>>,
    store: Arc<dyn Store>,
    model: Arc<dyn ModelBackend>,
    clock: Arc<dyn Clock>,
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
    ) -> Result<Self, PluginError> {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true).epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|e| PluginError::Engine(e.to_string()))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| PluginError::Engine(e.to_string()))?;
        Stage::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| PluginError::Engine(e.to_string()))?;
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
        Ok(Self {
            engine,
            linker,
            cache: Mutex::new(HashMap::new()),
            store,
            model,
            clock,
            stop_ticker,
        })
    }

    /// Compiles a component and reads its manifest through `describe`, the
    /// check `plugin add` makes before anything is stored.
    pub async fn inspect(&self, bytes: &[u8]) -> Result<Arc<LoadedPlugin>, PluginError> {
        let digest = sha256_hex(bytes);
        if let Some(hit) = self.cached(&digest) {
            return Ok(hit);
        }
        let engine = self.engine.clone();
        let owned = bytes.to_vec();
        let component = tokio::task::spawn_blocking(move || Component::new(&engine, &owned))
            .await
            .map_err(|e| PluginError::Engine(e.to_string()))?
            .map_err(|e| PluginError::InvalidComponent(first_line(&e)))?;
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| PluginError::WrongWorld(first_line(&e)))?;
        let pre =
            StagePre::new(instance_pre).map_err(|e| PluginError::WrongWorld(first_line(&e)))?;
        let text = self.describe(&pre).await?;
        let manifest =
            PluginManifest::parse(&format!("manifest of component {}", &digest[..12]), &text)?;
        let loaded = Arc::new(LoadedPlugin {
            digest: digest.clone(),
            manifest,
            pre,
        });
        lock(&self.cache).insert(digest, loaded.clone());
        Ok(loaded)
    }

    /// The registered plugin with this digest, compiled once and cached.
    pub async fn load(&self, digest: &str) -> Result<Arc<LoadedPlugin>, PluginError> {
        if let Some(hit) = self.cached(digest) {
            return Ok(hit);
        }
        let record = self
            .store
            .plugin_get(digest)
            .await?
            .ok_or_else(|| PluginError::Unknown(digest.to_string()))?;
        self.inspect(&record.component).await
    }

    fn cached(&self, digest: &str) -> Option<Arc<LoadedPlugin>> {
        lock(&self.cache).get(digest).cloned()
    }

    fn new_store(
        &self,
        limits: StoreLimits,
        call: Option<host::CallContext>,
        timeout: Duration,
    ) -> WasmStore<HostState> {
        let wasi = WasiCtx::builder()
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = HostState {
            wasi,
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

    async fn describe(&self, pre: &StagePre<HostState>) -> Result<String, PluginError> {
        let limits = StoreLimitsBuilder::new()
            .memory_size((DEFAULT_MEMORY_MB * 1024 * 1024) as usize)
            .trap_on_grow_failure(true)
            .build();
        let timeout = Duration::from_millis(DEFAULT_TIMEOUT_MS);
        let mut store = self.new_store(limits, None, timeout);
        let run = async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance.call_describe(&mut store).await
        };
        match tokio::time::timeout(timeout, run).await {
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
        let limits = &plugin.manifest.limits;
        let timeout_ms = limits.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        let memory = limits.memory_mb.unwrap_or(DEFAULT_MEMORY_MB) * 1024 * 1024;
        let store_limits = StoreLimitsBuilder::new()
            .memory_size(memory as usize)
            .trap_on_grow_failure(true)
            .build();
        let call = host::CallContext::new(
            self.store.clone(),
            self.model.clone(),
            self.clock.clone(),
            inv.clone(),
            plugin.manifest.wants(Capability::Model),
            limits.max_host_calls.unwrap_or(DEFAULT_MAX_HOST_CALLS),
        );
        let timeout = Duration::from_millis(timeout_ms);
        let mut store = self.new_store(store_limits, Some(call), timeout);
        let ctx = StageContext {
            run_id: inv.run_id.clone(),
            stage: inv.stage.clone(),
            attempt: inv.attempt.clamp(0, u32::MAX as i64) as u32,
            idempotency_key: inv.idempotency_key.clone(),
        };
        let inputs: Vec<WitArtifact> = inputs
            .into_iter()
            .map(|p| WitArtifact {
                name: p.name,
                media_type: p.media_type,
                bytes: p.bytes,
            })
            .collect();
        let run = async {
            let instance = plugin.pre.instantiate_async(&mut store).await?;
            instance.call_run(&mut store, &ctx, &inputs).await
        };
        // The epoch callback interrupts a guest past its deadline; this outer
        // bound also covers a host call (a model request) that hangs.
        let outcome = tokio::time::timeout(timeout + Duration::from_secs(1), run).await;
        let call = store.data_mut().call.take();
        let report = call.as_ref().map(|c| c.report()).unwrap_or_default();
        if let Some(failure) = call.and_then(|c| c.failure) {
            return Err((ExecError::Host(failure), report));
        }
        let result = match outcome {
            Err(_) => Err(ExecError::Timeout(timeout_ms)),
            Ok(Err(e)) => Err(classify_trap(&e, timeout_ms, memory >> 20)),
            Ok(Ok(Err(StageError::Retryable(m)))) => Err(ExecError::Retryable(m)),
            Ok(Ok(Err(StageError::Fatal(m)))) => Err(ExecError::Fatal(m)),
            Ok(Ok(Ok(outputs))) => check_outputs(&plugin.manifest, outputs),
        };
        result.map(|o| (o, report.clone())).map_err(|e| (e, report))
    }
}

fn classify_trap(e: &wasmtime::Error, timeout_ms: u64, memory_mb: u64) -> ExecError {
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return ExecError::Timeout(timeout_ms);
    }
    // `StoreLimits` with `trap_on_grow_failure` ends a memory bomb with this
    // error, which is not a `Trap`.
    if format!("{e:#}").contains("forcing trap when growing memory") {
        return ExecError::OutOfMemory(memory_mb);
    }
    ExecError::Trap(first_line(e))
}

fn check_outputs(
    manifest: &PluginManifest,
    outputs: Vec<WitArtifact>,
) -> Result<Vec<Payload>, ExecError> {
    let max = manifest
        .limits
        .max_output_bytes
        .unwrap_or(DEFAULT_MAX_OUTPUT_BYTES);
    let mut total = 0u64;
    let mut seen = std::collections::BTreeSet::new();
    for o in &outputs {
        if !manifest.outputs.contains(&o.name) {
            return Err(ExecError::Contract(format!(
                "output `{}` is not declared (declared: [{}])",
                o.name,
                manifest.outputs.join(", ")
            )));
        }
        if !seen.insert(o.name.as_str()) {
            return Err(ExecError::Contract(format!(
                "output `{}` was returned twice",
                o.name
            )));
        }
        total += o.bytes.len() as u64;
    }
    if let Some(missing) = manifest.outputs.iter().find(|n| !seen.contains(n.as_str())) {
        return Err(ExecError::Contract(format!(
            "declared output `{missing}` was not returned"
        )));
    }
    if total > max {
        return Err(ExecError::Contract(format!(
            "outputs total {total} bytes, over the {max}-byte limit (raise limits.max_output_bytes)"
        )));
    }
    Ok(outputs
        .into_iter()
        .map(|o| Payload {
            name: o.name,
            media_type: o.media_type,
            bytes: o.bytes,
        })
        .collect())
}

fn first_line(e: &wasmtime::Error) -> String {
    format!("{e:#}")
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
