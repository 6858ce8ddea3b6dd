//! Pipeline files: stages, the plugins they run and how inputs bind to
//! upstream outputs; planned into the jobs, edges and bindings of a run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::stages::{check_bindings, check_work, parse_plugin_ref};
use super::{ManifestError, PluginManifest, Source, check_name};
use crate::graph::{EdgeKind, InputBinding, NewEdge, RUN_INPUT_OUTPUT, RUN_INPUT_STAGE};
use crate::store::{GATE_OUTPUT, GateSpec};

/// The binding that names the run's submitted input.
pub const RUN_INPUT_REF: &str = "$input";
const DEFAULT_MAX_ATTEMPTS: u32 = 5;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPipeline {
    name: Spanned<String>,
    #[serde(default)]
    max_attempts: Option<Spanned<u32>>,
    #[serde(default)]
    stage: Vec<StageDecl>,
}

/// One `[[stage]]` of a pipeline file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageDecl {
    pub name: Spanned<String>,
    /// `NAME@REQ`, e.g. `draft@^1`; a bare name means any version. A stage
    /// names a plugin or is an approval gate (`approve`).
    #[serde(default)]
    pub plugin: Option<Spanned<String>>,
    /// An approval gate: what its approver is asked to check. It runs no
    /// plugin; its one output is its decision ([`GATE_OUTPUT`]).
    #[serde(default)]
    pub approve: Option<Spanned<String>>,
    /// A gate rejects itself this many seconds after it began to await.
    #[serde(default)]
    pub timeout_s: Option<Spanned<u64>>,
    /// `STAGE.OUTPUT`, a JSON array: the stage runs once per element, and
    /// its inputs bound to that output receive the element.
    #[serde(default)]
    pub map: Option<Spanned<String>>,
    /// Input name -> `STAGE.OUTPUT`, or `$input` for the run's input.
    #[serde(default)]
    pub inputs: BTreeMap<Spanned<String>, Spanned<String>>,
    /// Extra ordering-only dependencies, beside the plugin's own `after`.
    #[serde(default)]
    pub after: Vec<Spanned<String>>,
    #[serde(default)]
    pub max_attempts: Option<Spanned<u32>>,
}

/// A parsed pipeline file, not yet checked against plugins.
#[derive(Debug, Clone)]
pub struct Pipeline {
    file: String,
    text: String,
    raw: RawPipeline,
}

/// Resolves `name@req` to a registered plugin.
pub trait PluginResolver {
    /// # Errors
    /// A message saying why nothing matches and how to fix it.
    fn resolve(&self, name: &str, req: &semver::VersionReq) -> Result<ResolvedPlugin, String>;
}

#[derive(Debug, Clone)]
pub struct ResolvedPlugin {
    pub digest: String,
    pub manifest: PluginManifest,
}

/// A pipeline checked against its plugins: what `run_submit` writes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub pipeline: String,
    pub stages: Vec<PlannedStage>,
    pub edges: Vec<NewEdge>,
    pub inputs: Vec<InputBinding>,
}

#[derive(Debug, Clone)]
pub struct PlannedStage {
    pub name: String,
    pub work: PlannedWork,
    /// The `(stage, output)` it maps over, if it does.
    pub map: Option<(String, String)>,
    pub max_attempts: u32,
}

/// What a planned stage runs.
#[derive(Debug, Clone)]
pub enum PlannedWork {
    /// Shared by every stage that names the same plugin and requirement.
    Plugin(Arc<ResolvedPlugin>),
    Gate(GateSpec),
}

impl PlannedWork {
    /// The outputs the stage's job stores.
    pub fn outputs(&self) -> Vec<String> {
        match self {
            PlannedWork::Plugin(p) => p.manifest.outputs.clone(),
            PlannedWork::Gate(_) => vec![GATE_OUTPUT.to_string()],
        }
    }
}

impl Pipeline {
    pub fn parse(file: &str, text: &str) -> Result<Self, ManifestError> {
        let src = Source { file, text };
        let raw: RawPipeline = src.parse()?;
        check_name(&src, &raw.name, "pipeline name")?;
        if raw.stage.is_empty() {
            return Err(src.error(None, "the pipeline has no stages (add a [[stage]] table)"));
        }
        let mut names = BTreeSet::new();
        for stage in &raw.stage {
            check_name(&src, &stage.name, "stage name")?;
            if !names.insert(stage.name.get_ref().as_str()) {
                return Err(src.at(
                    &stage.name,
                    format!(
                        "stage `{}` is declared twice; give each stage its own name",
                        stage.name.get_ref()
                    ),
                ));
            }
            check_work(&src, stage)?;
            for attempts in stage.max_attempts.iter().chain(&raw.max_attempts) {
                if *attempts.get_ref() == 0 {
                    return Err(src.at(attempts, "max_attempts must be at least 1"));
                }
            }
        }
        Ok(Self {
            file: file.to_string(),
            text: text.to_string(),
            raw,
        })
    }

    pub fn name(&self) -> &str {
        self.raw.name.get_ref()
    }

    pub fn stages(&self) -> &[StageDecl] {
        &self.raw.stage
    }

    /// Resolves every stage's plugin and derives the DAG: rejects unknown
    /// plugins, stages and outputs, unbound inputs and cycles.
    /// The plugin requirements the stages name, each once (those written
    /// wrongly are left to [`Pipeline::plan`] to report).
    pub fn plugin_refs(&self) -> Vec<(String, semver::VersionReq)> {
        let src = Source {
            file: &self.file,
            text: &self.text,
        };
        let mut refs = Vec::new();
        for plugin in self.raw.stage.iter().filter_map(|s| s.plugin.as_ref()) {
            if let Ok(r) = parse_plugin_ref(&src, plugin)
                && !refs.contains(&r)
            {
                refs.push(r);
            }
        }
        refs
    }

    pub fn plan(&self, resolver: &dyn PluginResolver) -> Result<Plan, ManifestError> {
        let src = Source {
            file: &self.file,
            text: &self.text,
        };
        // Each plugin reference is resolved once, however many stages name
        // it (a fan-out names one thousands of times).
        let mut by_ref: HashMap<&str, Arc<ResolvedPlugin>> = HashMap::new();
        let mut resolved: HashMap<&str, Option<Arc<ResolvedPlugin>>> = HashMap::new();
        for stage in &self.raw.stage {
            let Some(spec) = &stage.plugin else {
                resolved.insert(stage.name.get_ref().as_str(), None);
                continue;
            };
            let plugin = match by_ref.get(spec.get_ref().as_str()) {
                Some(plugin) => plugin.clone(),
                None => {
                    let (name, req) = parse_plugin_ref(&src, spec)?;
                    let plugin = resolver
                        .resolve(&name, &req)
                        .map_err(|message| src.at(spec, message))?;
                    by_ref
                        .entry(spec.get_ref())
                        .or_insert(Arc::new(plugin))
                        .clone()
                }
            };
            resolved.insert(stage.name.get_ref().as_str(), Some(plugin));
        }

        let mut edges = BTreeSet::new();
        let mut inputs = Vec::new();
        let mut maps: HashMap<&str, (String, String)> = HashMap::new();
        for stage in &self.raw.stage {
            let me = stage.name.get_ref();
            let plugin = resolved[me.as_str()].as_deref();
            check_bindings(&src, stage, plugin.map(|p| &p.manifest))?;
            for (input, source) in &stage.inputs {
                let (from_stage, from_output) = self.resolve_source(&src, me, source, &resolved)?;
                if from_stage != RUN_INPUT_STAGE {
                    edges.insert(NewEdge {
                        from_stage: from_stage.clone(),
                        to_stage: me.clone(),
                        kind: EdgeKind::Data,
                    });
                }
                inputs.push(InputBinding {
                    stage: me.clone(),
                    input: input.get_ref().clone(),
                    from_stage,
                    from_output,
                });
            }
            if let Some(list) = &stage.map {
                maps.insert(me.as_str(), self.resolve_map(&src, stage, list, &resolved)?);
            }
            let from_manifest = plugin
                .zip(stage.plugin.as_ref())
                .into_iter()
                .flat_map(|(p, at)| p.manifest.after.iter().map(move |a| (a.as_str(), at)));
            let from_pipeline = stage.after.iter().map(|a| (a.get_ref().as_str(), a));
            for (dep, at) in from_manifest.chain(from_pipeline) {
                if !resolved.contains_key(dep) {
                    return Err(src.at(
                        at,
                        format!(
                            "stage `{me}` must run after stage `{dep}`, but the pipeline has no stage `{dep}`; add it or remove the dependency"
                        ),
                    ));
                }
                if dep == me {
                    return Err(src.at(at, format!("stage `{me}` cannot run after itself")));
                }
                edges.insert(NewEdge {
                    from_stage: dep.to_string(),
                    to_stage: me.clone(),
                    kind: EdgeKind::After,
                });
            }
        }
        let edges: Vec<NewEdge> = edges.into_iter().collect();
        self.check_acyclic(&src, &edges)?;

        let default_attempts = self.raw.max_attempts.as_ref().map(|a| *a.get_ref());
        let stages = self
            .raw
            .stage
            .iter()
            .map(|s| PlannedStage {
                name: s.name.get_ref().clone(),
                map: maps.remove(s.name.get_ref().as_str()),
                work: match (&resolved[s.name.get_ref().as_str()], &s.approve) {
                    (Some(plugin), _) => PlannedWork::Plugin(plugin.clone()),
                    (None, question) => PlannedWork::Gate(GateSpec {
                        question: question
                            .as_ref()
                            .map(|q| q.get_ref().clone())
                            .unwrap_or_default(),
                        timeout_ms: s.timeout_s.as_ref().map(|t| {
                            i64::try_from(t.get_ref().saturating_mul(1000)).unwrap_or(i64::MAX)
                        }),
                    }),
                },
                max_attempts: s
                    .max_attempts
                    .as_ref()
                    .map(|a| *a.get_ref())
                    .or(default_attempts)
                    .unwrap_or(DEFAULT_MAX_ATTEMPTS),
            })
            .collect();
        Ok(Plan {
            pipeline: self.name().to_string(),
            stages,
            edges,
            inputs,
        })
    }

    fn resolve_source(
        &self,
        src: &Source<'_>,
        me: &str,
        source: &Spanned<String>,
        resolved: &HashMap<&str, Option<Arc<ResolvedPlugin>>>,
    ) -> Result<(String, String), ManifestError> {
        let text = source.get_ref();
        if text == RUN_INPUT_REF {
            return Ok((RUN_INPUT_STAGE.to_string(), RUN_INPUT_OUTPUT.to_string()));
        }
        let Some((stage, output)) = text.split_once('.') else {
            return Err(src.at(
                source,
                format!("input source `{text}` must be `STAGE.OUTPUT` (e.g. \"draft.draft\") or \"$input\""),
            ));
        };
        let Some(upstream) = resolved.get(stage) else {
            return Err(src.at(
                source,
                format!("stage `{me}` reads from stage `{stage}`, which is not in this pipeline"),
            ));
        };
        if stage == me {
            return Err(src.at(
                source,
                format!("stage `{me}` cannot consume its own output"),
            ));
        }
        match upstream {
            Some(plugin) if !plugin.manifest.outputs.iter().any(|o| o == output) => {
                return Err(src.at(
                    source,
                    format!(
                        "stage `{stage}` has no output `{output}` (plugin `{}` outputs [{}])",
                        plugin.manifest.name,
                        plugin.manifest.outputs.join(", ")
                    ),
                ));
            }
            None if output != GATE_OUTPUT => {
                return Err(src.at(
                    source,
                    format!(
                        "stage `{stage}` is an approval gate: its one output is `{GATE_OUTPUT}` (write \"{stage}.{GATE_OUTPUT}\")"
                    ),
                ));
            }
            _ => {}
        }
        Ok((stage.to_string(), output.to_string()))
    }

    /// The list a stage maps over: an upstream stage's output, which at
    /// least one of its inputs is bound to (those receive the element).
    fn resolve_map(
        &self,
        src: &Source<'_>,
        stage: &StageDecl,
        list: &Spanned<String>,
        resolved: &HashMap<&str, Option<Arc<ResolvedPlugin>>>,
    ) -> Result<(String, String), ManifestError> {
        let me = stage.name.get_ref();
        if list.get_ref() == RUN_INPUT_REF {
            return Err(src.at(
                list,
                format!("stage `{me}` maps over the run's input; map over an upstream stage's output (\"STAGE.OUTPUT\"), e.g. a stage that splits the input"),
            ));
        }
        let source = self.resolve_source(src, me, list, resolved)?;
        let bound = stage.inputs.values().any(|s| s.get_ref() == list.get_ref());
        if !bound {
            return Err(src.at(
                list,
                format!(
                    "stage `{me}` maps over `{}`, but no input is bound to it; bind the input that takes one element, e.g. `inputs = {{ item = \"{}\" }}`",
                    list.get_ref(),
                    list.get_ref()
                ),
            ));
        }
        Ok(source)
    }

    /// Kahn's algorithm; on a cycle, names its stages in order.
    fn check_acyclic(&self, src: &Source<'_>, edges: &[NewEdge]) -> Result<(), ManifestError> {
        let mut indegree: BTreeMap<&str, usize> = self
            .raw
            .stage
            .iter()
            .map(|s| (s.name.get_ref().as_str(), 0))
            .collect();
        let mut out_of: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for e in edges {
            *indegree.entry(e.to_stage.as_str()).or_default() += 1;
            out_of
                .entry(e.from_stage.as_str())
                .or_default()
                .push(e.to_stage.as_str());
        }
        let mut ready: Vec<&str> = indegree
            .iter()
            .filter(|(_, d)| **d == 0)
            .map(|(s, _)| *s)
            .collect();
        let mut done = 0;
        while let Some(stage) = ready.pop() {
            done += 1;
            for &to in out_of.get(stage).into_iter().flatten() {
                let d = indegree.entry(to).or_default();
                *d -= 1;
                if *d == 0 {
                    ready.push(to);
                }
            }
        }
        if done == indegree.len() {
            return Ok(());
        }
        // Every stage left has an unprocessed predecessor: walk backwards
        // until a stage repeats, and report that loop in forward order.
        let left: BTreeSet<&str> = indegree
            .iter()
            .filter(|(_, d)| **d > 0)
            .map(|(s, _)| *s)
            .collect();
        // One unprocessed predecessor of each stage left, looked up once
        // (a search of every edge at every step took minutes on a cycle
        // of 100,000 stages).
        let mut before: BTreeMap<&str, &str> = BTreeMap::new();
        for e in edges {
            if left.contains(e.from_stage.as_str()) {
                before
                    .entry(e.to_stage.as_str())
                    .or_insert(e.from_stage.as_str());
            }
        }
        let mut path: Vec<&str> = Vec::new();
        let mut on_path: BTreeMap<&str, usize> = BTreeMap::new();
        let mut at = *left.iter().next().expect("a cycle leaves stages behind");
        while !on_path.contains_key(at) {
            on_path.insert(at, path.len());
            path.push(at);
            at = before
                .get(at)
                .expect("an unprocessed stage has an unprocessed predecessor");
        }
        let start = on_path[at];
        let mut cycle: Vec<&str> = path[start..].to_vec();
        cycle.reverse();
        cycle.push(cycle[0]);
        let first = self.raw.stage.iter().find(|s| s.name.get_ref() == cycle[0]);
        Err(src.error(
            first.map(|s| s.name.span()),
            format!(
                "stages form a cycle: {}; remove one of these inputs or `after` entries",
                cycle.join(" -> ")
            ),
        ))
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
