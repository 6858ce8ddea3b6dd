//! The plugin registry (content-addressed, immutable versions) and run
//! submission: a pipeline resolved against it, pinned, written in one txn.

use std::sync::Arc;

use crate::clock::Clock;
use crate::manifest::{ManifestError, Pipeline, PluginManifest, PluginResolver, ResolvedPlugin};
use crate::plugin::{PluginError, PluginHost};
use crate::store::{
    NewJob, PluginPut, PluginPutOutcome, RunSubmit, RunSubmitOutcome, Store, StoreError,
};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

#[derive(Debug, Clone)]
pub struct Registered {
    pub digest: String,
    pub manifest: PluginManifest,
    pub outcome: PluginPutOutcome,
}

/// Validates a component (it compiles, implements `stage`, describes a valid
/// manifest) and stores it; nothing is stored when any check fails.
pub async fn plugin_register(
    store: &Arc<dyn Store>,
    host: &PluginHost,
    component: Vec<u8>,
    clock: &dyn Clock,
) -> Result<Registered, RegistryError> {
    let loaded = host.inspect(&component).await?;
    let manifest = loaded.manifest.clone();
    let outcome = store
        .plugin_put(PluginPut {
            digest: loaded.digest.clone(),
            name: manifest.name.clone(),
            version: manifest.version.to_string(),
            manifest: toml::to_string(&manifest).unwrap_or_default(),
            component,
            now: clock.now_ms(),
        })
        .await?;
    Ok(Registered {
        digest: loaded.digest.clone(),
        manifest,
        outcome,
    })
}

/// Resolves plugin requirements against a snapshot of the registry: the
/// highest non-yanked version that matches.
#[derive(Debug, Clone, Default)]
pub struct RegistrySnapshot {
    plugins: Vec<ResolvedPlugin>,
    yanked: Vec<String>,
}

impl RegistrySnapshot {
    pub async fn load(store: &dyn Store) -> Result<Self, RegistryError> {
        let mut snapshot = Self::default();
        for summary in store.plugin_list().await? {
            let manifest = PluginManifest::parse(
                &format!("stored manifest of {}", summary.name),
                &summary.manifest,
            )?;
            if summary.yanked {
                snapshot.yanked.push(summary.digest.clone());
            }
            snapshot.plugins.push(ResolvedPlugin {
                digest: summary.digest,
                manifest,
            });
        }
        Ok(snapshot)
    }

    /// A snapshot from manifests alone (digests made up from name@version),
    /// for checking pipelines without a database.
    pub fn from_manifests(manifests: Vec<PluginManifest>) -> Self {
        let plugins = manifests
            .into_iter()
            .map(|m| ResolvedPlugin {
                digest: format!("{}@{}", m.name, m.version),
                manifest: m,
            })
            .collect();
        Self {
            plugins,
            yanked: Vec::new(),
        }
    }
}

impl PluginResolver for RegistrySnapshot {
    fn resolve(&self, name: &str, req: &semver::VersionReq) -> Result<ResolvedPlugin, String> {
        let candidates: Vec<&ResolvedPlugin> = self
            .plugins
            .iter()
            .filter(|p| p.manifest.name == name)
            .collect();
        if candidates.is_empty() {
            return Err(format!(
                "plugin `{name}` is not registered (register it with `ratchet plugin add {name}.wasm`)"
            ));
        }
        candidates
            .iter()
            .filter(|p| req.matches(&p.manifest.version) && !self.yanked.contains(&p.digest))
            .max_by(|a, b| a.manifest.version.cmp(&b.manifest.version))
            .map(|p| (*p).clone())
            .ok_or_else(|| {
                let versions: Vec<String> =
                    candidates.iter().map(|p| p.manifest.version.to_string()).collect();
                format!(
                    "no registered version of plugin `{name}` matches `{req}` (registered: {}); register one or change the requirement",
                    versions.join(", ")
                )
            })
    }
}

/// Plans the pipeline against the registry, pins every stage's digest and
/// writes the run, its jobs, edges and bindings in one transaction.
pub async fn run_submit(
    store: &dyn Store,
    pipeline: &Pipeline,
    input: Vec<u8>,
    idempotency_key: Option<String>,
    clock: &dyn Clock,
) -> Result<RunSubmitOutcome, RegistryError> {
    let snapshot = RegistrySnapshot::load(store).await?;
    let plan = pipeline.plan(&snapshot)?;
    let jobs = plan
        .stages
        .iter()
        .map(|s| NewJob {
            stage: s.name.clone(),
            plugin_digest: s.plugin.digest.clone(),
            outputs: s.plugin.manifest.outputs.clone(),
            emits: s.plugin.manifest.emits.clone(),
            max_attempts: i64::from(s.max_attempts),
        })
        .collect();
    let outcome = store
        .run_submit(RunSubmit {
            run_id: uuid::Uuid::now_v7().to_string(),
            pipeline: plan.pipeline,
            idempotency_key,
            input,
            jobs,
            edges: plan.edges,
            inputs: plan.inputs,
            now: clock.now_ms(),
        })
        .await?;
    Ok(outcome)
}
