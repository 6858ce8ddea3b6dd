//! The plugin registry (content-addressed, immutable versions) and run
//! submission: a pipeline resolved against it, pinned, written in one txn.

use std::collections::HashMap;

use crate::clock::Clock;
use crate::manifest::{
    ManifestError, Pipeline, PlannedWork, PluginManifest, PluginResolver, ResolvedPlugin,
};
use crate::plugin::{Caps, PluginError, PluginHost};
use crate::store::{
    CallerTransaction, Catalog, History, Intake, JobRepin, JobState, MapSpec, NewJob, PluginPut,
    PluginPutOutcome, PluginSummary, PluginVersion, RepinOutcome, RunState, RunSubmit,
    RunSubmitOutcome, StageWork, StoreError, VersionKeyRange, version_key,
};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The request cannot be carried out as asked (exit code 2 in the CLI).
    #[error("{0}")]
    Refused(String),
    /// What the request names does not exist (exit code 2; HTTP 404).
    #[error("{0}")]
    NotFound(String),
}

#[derive(Debug, Clone)]
pub struct Registered {
    pub digest: String,
    pub manifest: PluginManifest,
    pub outcome: PluginPutOutcome,
}

/// Validates a component (it compiles, implements `stage`, describes a valid
/// manifest, the operator's policy admits it) and stores it; nothing is
/// stored when any check fails.
pub async fn plugin_register(
    store: &dyn Catalog,
    host: &PluginHost,
    component: Vec<u8>,
    clock: &dyn Clock,
) -> Result<Registered, RegistryError> {
    let loaded = host.admit(&component).await?;
    let manifest = loaded.manifest.clone();
    let outcome = store
        .plugin_put(PluginPut {
            digest: loaded.digest.clone(),
            name: manifest.name.clone(),
            version: manifest.version.to_string(),
            manifest: toml::to_string(&manifest).unwrap_or_default(),
            component,
            contract: loaded.contract().version().to_string(),
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
    /// Every version of the plugins a pipeline names (name, version and
    /// digest only).
    versions: Vec<PluginVersion>,
    /// The parsed manifests of the versions that can be chosen.
    manifests: HashMap<String, PluginManifest>,
}

impl RegistrySnapshot {
    /// What resolving `pipeline`'s plugins needs, and no more: for each
    /// requirement the version it chooses, found by walking the plugin's
    /// versions in its range from the highest down (every version of the
    /// plugin only when none matches, for the error); then the manifests
    /// of the chosen ones. Its cost grows neither with the other
    /// registered plugins nor with the versions of its own.
    pub async fn load_for(
        store: &(impl Catalog + ?Sized),
        pipeline: &Pipeline,
    ) -> Result<Self, RegistryError> {
        let mut snapshot = Self::default();
        let mut unmatched = Vec::new();
        for (name, req) in pipeline.plugin_refs() {
            match best_version(store, &name, &req).await? {
                Some(best) => snapshot.versions.push(best),
                None => unmatched.push(name),
            }
        }
        if !unmatched.is_empty() {
            snapshot
                .versions
                .extend(store.plugin_versions_of(&unmatched).await?);
        }
        let chosen: Vec<String> = snapshot.versions.iter().map(|v| v.digest.clone()).collect();
        for (digest, text) in store.plugin_manifests(&chosen).await? {
            let manifest = PluginManifest::parse(&format!("stored manifest of {digest}"), &text)?;
            snapshot.manifests.insert(digest, manifest);
        }
        Ok(snapshot)
    }

    /// The versions this snapshot read: the one each requirement chose (and
    /// every version of a plugin none of whose versions matched).
    pub fn versions(&self) -> &[PluginVersion] {
        &self.versions
    }

    /// A snapshot from manifests alone (digests made up from name@version),
    /// for checking pipelines without a database.
    pub fn from_manifests(manifests: Vec<PluginManifest>) -> Self {
        let mut snapshot = Self::default();
        for m in manifests {
            let digest = format!("{}@{}", m.name, m.version);
            snapshot.versions.push(PluginVersion {
                digest: digest.clone(),
                name: m.name.clone(),
                version: m.version.clone(),
                yanked: false,
            });
            snapshot.manifests.insert(digest, m);
        }
        snapshot
    }

    /// The highest non-yanked version of `name` that `req` matches.
    fn best(&self, name: &str, req: &semver::VersionReq) -> Option<&PluginVersion> {
        self.versions
            .iter()
            .filter(|v| v.name == name && !v.yanked && req.matches(&v.version))
            .max_by(|a, b| a.version.cmp(&b.version))
    }
}

/// The highest non-yanked version of `name` that `req` matches, read a
/// page of candidates at a time. Candidates come in [`version_key`] order,
/// which is semver's except among the pre-releases of one version (they
/// share a key): once one matches, the walk ends at the next key.
pub async fn best_version(
    store: &(impl Catalog + ?Sized),
    name: &str,
    req: &semver::VersionReq,
) -> Result<Option<PluginVersion>, RegistryError> {
    const PAGE: i64 = 16;
    let range = VersionKeyRange::of(req);
    let mut best: Option<(String, PluginVersion)> = None;
    let mut offset = 0;
    loop {
        let page = store.plugin_candidates(name, &range, offset, PAGE).await?;
        for candidate in &page {
            let key = version_key(&candidate.version);
            if let Some((best_key, best)) = &best {
                if *best_key != key {
                    return Ok(Some(best.clone()));
                }
                if candidate.version <= best.version {
                    continue;
                }
            }
            if req.matches(&candidate.version) {
                best = Some((key, candidate.clone()));
            }
        }
        if (page.len() as i64) < PAGE {
            return Ok(best.map(|(_, best)| best));
        }
        offset += PAGE;
    }
}

impl PluginResolver for RegistrySnapshot {
    fn resolve(&self, name: &str, req: &semver::VersionReq) -> Result<ResolvedPlugin, String> {
        let candidates: Vec<&PluginVersion> =
            self.versions.iter().filter(|v| v.name == name).collect();
        if candidates.is_empty() {
            return Err(format!(
                "plugin `{name}` is not registered (register it with `ratchet plugin add {name}.wasm`)"
            ));
        }
        let Some(best) = self.best(name, req) else {
            let versions: Vec<String> = candidates.iter().map(|v| v.version.to_string()).collect();
            return Err(format!(
                "no registered version of plugin `{name}` matches `{req}` (registered: {}); register one or change the requirement",
                versions.join(", ")
            ));
        };
        let manifest = self.manifests.get(&best.digest).cloned().ok_or_else(|| {
            format!(
                "the manifest of plugin `{name}@{}` was not loaded",
                best.version
            )
        })?;
        Ok(ResolvedPlugin {
            digest: best.digest.clone(),
            manifest,
        })
    }
}

/// Plans the pipeline against the registry, pins every stage's digest and
/// writes the run, its jobs, edges and bindings in one transaction. A
/// mapped stage's list may hold up to `caps.max_map_elements` elements.
pub async fn run_submit(
    store: &(impl Catalog + Intake + ?Sized),
    pipeline: &Pipeline,
    input: Vec<u8>,
    idempotency_key: Option<String>,
    caps: &Caps,
    clock: &dyn Clock,
) -> Result<RunSubmitOutcome, RegistryError> {
    let r = run_plan(store, pipeline, input, idempotency_key, caps, clock).await?;
    Ok(store.run_submit(r).await?)
}

/// [`run_submit`] inside a transaction the caller opened on the same
/// database and commits or rolls back: the run exists if and only if the
/// caller commits (docs/embedding.md). The registry is read through
/// `store`, outside the caller's transaction.
///
/// On PostgreSQL, with the caller's own transaction:
///
/// ```no_run
/// use ratchet_runtime::clock::SystemClock;
/// use ratchet_runtime::manifest::Pipeline;
/// use ratchet_runtime::plugin::Caps;
/// use ratchet_runtime::{registry, store};
///
/// # async fn order(pipeline: &Pipeline) -> Result<(), Box<dyn std::error::Error>> {
/// let url = "postgres://postgres@127.0.0.1:5432/test";
/// let (store, pool) = (store::open(url).await?, sqlx::PgPool::connect(url).await?);
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES ('o-17')").execute(&mut *tx).await?;
/// let (input, key) = (b"o-17".to_vec(), Some("o-17".to_string()));
/// let caps = Caps::default();
/// registry::run_submit_in(store.as_ref(), &mut *tx, pipeline, input, key, &caps, &SystemClock)
///     .await?;
/// tx.commit().await?; // the order and its run, or neither
/// # Ok(()) }
/// ```
///
/// On SQLite, on the writer's connection [`crate::store::SqliteStore::write`]
/// lends, committed when the closure returns `Ok`:
///
/// ```no_run
/// # use ratchet_runtime::clock::SystemClock;
/// # use ratchet_runtime::manifest::Pipeline;
/// # use ratchet_runtime::plugin::Caps;
/// # use ratchet_runtime::registry::{self, RegistryError};
/// # use ratchet_runtime::store::SqliteStore;
/// # async fn order(pipeline: &Pipeline) -> Result<(), RegistryError> {
/// let store = SqliteStore::open("sqlite://orders.db").await?;
/// let caps = Caps::default();
/// store
///     .write(async |conn: &mut sqlx::SqliteConnection| {
///         let (input, key) = (b"o-17".to_vec(), Some("o-17".to_string()));
///         registry::run_submit_in(&store, conn, pipeline, input, key, &caps, &SystemClock).await
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub async fn run_submit_in(
    store: &(impl Catalog + ?Sized),
    tx: impl CallerTransaction,
    pipeline: &Pipeline,
    input: Vec<u8>,
    idempotency_key: Option<String>,
    caps: &Caps,
    clock: &dyn Clock,
) -> Result<RunSubmitOutcome, RegistryError> {
    let r = run_plan(store, pipeline, input, idempotency_key, caps, clock).await?;
    Ok(tx.run_submit(r).await?)
}

/// The rows of a run of `pipeline`, planned against the registry.
async fn run_plan(
    store: &(impl Catalog + ?Sized),
    pipeline: &Pipeline,
    input: Vec<u8>,
    idempotency_key: Option<String>,
    caps: &Caps,
    clock: &dyn Clock,
) -> Result<RunSubmit, RegistryError> {
    let snapshot = RegistrySnapshot::load_for(store, pipeline).await?;
    let plan = pipeline.plan(&snapshot)?;
    let mut jobs: Vec<NewJob> = plan
        .stages
        .iter()
        .map(|s| NewJob {
            stage: s.name.clone(),
            outputs: s.work.outputs(),
            work: match &s.work {
                PlannedWork::Plugin(p) => StageWork::Plugin(p.digest.clone()),
                PlannedWork::Gate(gate) => StageWork::Gate(gate.clone()),
            },
            emits: match &s.work {
                PlannedWork::Plugin(p) => p.manifest.emits.clone(),
                PlannedWork::Gate(_) => Vec::new(),
            },
            map: s.map.as_ref().map(|(stage, output)| MapSpec {
                stage: stage.clone(),
                output: output.clone(),
                cap: i64::try_from(caps.max_map_elements).unwrap_or(i64::MAX),
            }),
            lists: Default::default(),
            max_attempts: i64::from(s.max_attempts),
        })
        .collect();
    // The stage of each list learns how long it may be: its attempt fails
    // before it commits a list that cannot be mapped.
    let maps: Vec<MapSpec> = jobs.iter().filter_map(|j| j.map.clone()).collect();
    for map in maps {
        if let Some(job) = jobs.iter_mut().find(|j| j.stage == map.stage) {
            job.lists.insert(map.output, map.cap);
        }
    }
    Ok(RunSubmit {
        run_id: uuid::Uuid::now_v7().to_string(),
        pipeline: plan.pipeline,
        idempotency_key,
        input,
        jobs,
        edges: plan.edges,
        inputs: plan.inputs,
        now: clock.now_ms(),
    })
}

/// `name` or `name@version` as the CLI takes it.
pub fn parse_plugin_spec(spec: &str) -> Result<(String, Option<semver::Version>), RegistryError> {
    let (name, version) = match spec.split_once('@') {
        Some((name, version)) => {
            let version = semver::Version::parse(version).map_err(|e| {
                RegistryError::Refused(format!(
                    "`{spec}`: `{version}` is not a version ({e}); write NAME@1.2.3"
                ))
            })?;
            (name, Some(version))
        }
        None => (spec, None),
    };
    Ok((name.to_string(), version))
}

/// Registered versions of `name` (one, when `version` is given), oldest first.
pub async fn plugin_versions(
    store: &(impl Catalog + ?Sized),
    name: &str,
    version: Option<&semver::Version>,
) -> Result<Vec<PluginSummary>, RegistryError> {
    let found: Vec<PluginSummary> = store
        .plugin_list()
        .await?
        .into_iter()
        .filter(|p| p.name == name && version.is_none_or(|v| p.version == v.to_string()))
        .collect();
    if found.is_empty() {
        let what = version.map_or(name.to_string(), |v| format!("{name}@{v}"));
        return Err(RegistryError::NotFound(format!(
            "plugin `{what}` is not registered (see `ratchet plugin list`)"
        )));
    }
    Ok(found)
}

/// Pins a not-yet-started stage of a running run to another registered
/// version of its plugin, when that version consumes and produces exactly
/// the same artifacts. Returns the new digest.
pub async fn stage_upgrade(
    store: &(impl Catalog + Intake + History + ?Sized),
    run_id: &str,
    stage: &str,
    to: &semver::Version,
    clock: &dyn Clock,
) -> Result<String, RegistryError> {
    let refused = |m: String| Err(RegistryError::Refused(m));
    let jobs = store.job_list(run_id).await?;
    if jobs.is_empty() {
        return refused(format!(
            "run `{run_id}` does not exist (list runs with `ratchet status`)"
        ));
    }
    let Some(job) = jobs.iter().find(|j| j.stage == stage) else {
        let stages: Vec<&str> = jobs.iter().map(|j| j.stage.as_str()).collect();
        return refused(format!(
            "run `{run_id}` has no stage `{stage}` (stages: {})",
            stages.join(", ")
        ));
    };
    // The store checks run and job state again, atomically, when repinning,
    // with the journal and the new version's `after`; checking here first
    // gives the most precise refusal.
    let run = store.run_get(run_id).await?;
    if let Some(run) = run.filter(|r| r.state != RunState::Running) {
        return refused(format!(
            "run `{run_id}` is {}; only running runs can be upgraded",
            run.state
        ));
    }
    if !matches!(job.state, JobState::Blocked | JobState::Ready) {
        return refused(format!(
            "stage `{stage}` is {}; only a stage that has not started (blocked or ready) can be upgraded",
            job.state.as_str()
        ));
    }
    let Some(pinned) = &job.plugin_digest else {
        return refused(format!(
            "stage `{stage}` of run `{run_id}` is an approval gate: it runs no plugin to upgrade"
        ));
    };
    let current = store.plugin_get(pinned).await?.ok_or_else(|| {
        RegistryError::Refused(format!("stage `{stage}` is pinned to an unknown plugin"))
    })?;
    let from = PluginManifest::parse("pinned manifest", &current.summary.manifest)?;
    let target = plugin_versions(store, &from.name, Some(to))
        .await?
        .remove(0);
    if target.yanked {
        return refused(format!(
            "{}@{to} is yanked; register a new version instead",
            from.name
        ));
    }
    let to_manifest = PluginManifest::parse("target manifest", &target.manifest)?;
    let same = |a: &[String], b: &[String]| {
        let (mut a, mut b) = (a.to_vec(), b.to_vec());
        a.sort();
        b.sort();
        a == b
    };
    if !same(&from.inputs, &to_manifest.inputs) || !same(&from.outputs, &to_manifest.outputs) {
        return refused(format!(
            "{}@{to} is not compatible with {}@{}: inputs [{}] -> [{}], outputs [{}] -> [{}]; both must stay the same",
            from.name,
            from.name,
            from.version,
            from.inputs.join(", "),
            to_manifest.inputs.join(", "),
            from.outputs.join(", "),
            to_manifest.outputs.join(", ")
        ));
    }
    let outcome = store
        .job_repin(JobRepin {
            run_id: run_id.to_string(),
            stage: stage.to_string(),
            from_digest: pinned.clone(),
            to_digest: target.digest.clone(),
            emits: to_manifest.emits.clone(),
            after: to_manifest.after.clone(),
            detail: format!(
                "stage `{stage}` upgraded from {}@{} ({}) to {}@{to} ({})",
                from.name, from.version, pinned, from.name, target.digest
            ),
            now: clock.now_ms(),
        })
        .await?;
    match outcome {
        RepinOutcome::Repinned => Ok(target.digest),
        RepinOutcome::NotFound => refused(format!("run `{run_id}` has no stage `{stage}`")),
        RepinOutcome::RunFinished(state) => refused(format!(
            "run `{run_id}` is {state}; only running runs can be upgraded"
        )),
        RepinOutcome::JobNotWaiting(state) => refused(format!(
            "stage `{stage}` is {}; only a stage that has not started (blocked or ready) can be upgraded",
            state.as_str()
        )),
        RepinOutcome::PinMoved(_) => {
            refused(format!("stage `{stage}` was repinned meanwhile; try again"))
        }
        RepinOutcome::Journaled => refused(format!(
            "stage `{stage}` already journaled model answers under its pinned version; a new version would be replayed answers to other questions"
        )),
        RepinOutcome::Gate => refused(format!(
            "stage `{stage}` of run `{run_id}` is an approval gate: it runs no plugin to upgrade"
        )),
        RepinOutcome::AfterRefused(reason) => refused(format!(
            "{}@{to} cannot replace the pinned version of `{stage}`: {reason}",
            from.name
        )),
    }
}
