//! Pipeline files: stages, the plugins they run and how inputs bind to
//! upstream outputs; planned into the jobs, edges and bindings of a run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::{ManifestError, PluginManifest, Source, check_name};
use crate::graph::{EdgeKind, InputBinding, NewEdge, RUN_INPUT_OUTPUT, RUN_INPUT_STAGE};

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
    /// `NAME@REQ`, e.g. `draft@^1`; a bare name means any version.
    pub plugin: Spanned<String>,
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
    /// Shared by every stage that names the same plugin and requirement.
    pub plugin: Arc<ResolvedPlugin>,
    pub max_attempts: u32,
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
        for stage in &self.raw.stage {
            if let Ok(r) = parse_plugin_ref(&src, &stage.plugin)
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
        let mut resolved: HashMap<&str, Arc<ResolvedPlugin>> = HashMap::new();
        for stage in &self.raw.stage {
            let reference = stage.plugin.get_ref().as_str();
            let plugin = match by_ref.get(reference) {
                Some(plugin) => plugin.clone(),
                None => {
                    let (name, req) = parse_plugin_ref(&src, &stage.plugin)?;
                    let plugin = resolver
                        .resolve(&name, &req)
                        .map_err(|message| src.at(&stage.plugin, message))?;
                    by_ref.entry(reference).or_insert(Arc::new(plugin)).clone()
                }
            };
            resolved.insert(stage.name.get_ref().as_str(), plugin);
        }

        let mut edges = BTreeSet::new();
        let mut inputs = Vec::new();
        for stage in &self.raw.stage {
            let me = stage.name.get_ref();
            let manifest = &resolved[me.as_str()].manifest;
            for (input, source) in &stage.inputs {
                if !manifest.inputs.contains(input.get_ref()) {
                    return Err(src.at(
                        input,
                        format!(
                            "stage `{me}` binds input `{}`, but plugin `{}` declares inputs [{}]; remove the binding or fix its name",
                            input.get_ref(),
                            manifest.name,
                            manifest.inputs.join(", ")
                        ),
                    ));
                }
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
            for declared in &manifest.inputs {
                if !stage.inputs.keys().any(|k| k.get_ref() == declared) {
                    return Err(src.at(
                        &stage.name,
                        format!(
                            "stage `{me}` does not bind input `{declared}` that plugin `{}` needs; add `inputs = {{ {declared} = \"STAGE.OUTPUT\" }}`",
                            manifest.name
                        ),
                    ));
                }
            }
            let from_manifest = manifest.after.iter().map(|a| (a.as_str(), &stage.plugin));
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
                plugin: resolved[s.name.get_ref().as_str()].clone(),
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
        resolved: &HashMap<&str, Arc<ResolvedPlugin>>,
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
        if !upstream.manifest.outputs.iter().any(|o| o == output) {
            return Err(src.at(
                source,
                format!(
                    "stage `{stage}` has no output `{output}` (plugin `{}` outputs [{}])",
                    upstream.manifest.name,
                    upstream.manifest.outputs.join(", ")
                ),
            ));
        }
        Ok((stage.to_string(), output.to_string()))
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

fn parse_plugin_ref(
    src: &Source<'_>,
    spec: &Spanned<String>,
) -> Result<(String, semver::VersionReq), ManifestError> {
    let text = spec.get_ref();
    let (name, req) = text.split_once('@').unwrap_or((text, "*"));
    if !super::is_valid_name(name) {
        return Err(src.at(
            spec,
            format!("plugin `{text}` must be written NAME@VERSION_REQ, e.g. \"draft@^1\""),
        ));
    }
    let req = semver::VersionReq::parse(req).map_err(|e| {
        src.at(spec, format!("version requirement `{req}` of plugin `{name}` is invalid ({e}); e.g. \"^1\" or \"=1.2.0\""))
    })?;
    Ok((name.to_string(), req))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Resolves `pass` and counts how often it was asked.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl PluginResolver for Counting {
        fn resolve(&self, name: &str, _: &semver::VersionReq) -> Result<ResolvedPlugin, String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            let manifest = PluginManifest::parse(
                "pass manifest",
                &format!("name = \"{name}\"\nversion = \"1.0.0\"\ninputs = [\"in\"]\noutputs = [\"out\"]\n"),
            )
            .map_err(|e| e.to_string())?;
            Ok(ResolvedPlugin {
                digest: format!("{name}-digest"),
                manifest,
            })
        }
    }

    /// A fan-out names one plugin once per stage: each stage resolved (and
    /// cloned) it again, a tenth of submitting a 500-stage run.
    #[test]
    fn stages_naming_the_same_plugin_share_one_resolution() {
        let mut text = String::from("name = \"fan\"\n");
        for i in 0..50 {
            text.push_str(&format!(
                "[[stage]]\nname = \"s{i}\"\nplugin = \"pass@^1\"\ninputs = {{ in = \"$input\" }}\n"
            ));
        }
        text.push_str(
            "[[stage]]\nname = \"t\"\nplugin = \"pass@=1.0.0\"\ninputs = { in = \"s0.out\" }\n",
        );
        let pipeline = Pipeline::parse("fan.toml", &text).expect("parse");
        let resolver = Counting::default();
        let plan = pipeline.plan(&resolver).expect("plan");
        assert_eq!(resolver.0.load(Ordering::SeqCst), 2, "once per reference");
        assert_eq!(plan.stages.len(), 51);
        assert!(Arc::ptr_eq(&plan.stages[0].plugin, &plan.stages[49].plugin));
        assert_eq!(plan.edges.len(), 1);
    }
}
