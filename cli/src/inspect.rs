//! Read-only commands: `plugin list`, `status`, `artifacts`, `audit`.
//! What the client offers (a run, its attempts, artifacts, model calls,
//! history and deliveries, the plugins) is read through it, as the HTTP
//! API reads it; the audit reads the store.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;

use crate::{BadInput, Env, when};
use ratchet_runtime::client::RunDetail;
use ratchet_runtime::relay::Sinks;
use ratchet_runtime::store::{
    AttemptRow, CallKind, DeliveryFilter, JobRow, JobState, ModelCall, PluginSummary, RunQuery,
    RunRow, map,
};
use ratchet_runtime::text::escape_controls;

/// `value` on stdout as pretty JSON, the command's whole output.
pub fn print_json(value: &serde_json::Value) -> Result<ExitCode> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(ExitCode::SUCCESS)
}

pub async fn plugin_list(env: &Env, json: bool) -> Result<ExitCode> {
    let plugins = env.client.plugins().await?;
    if json {
        return print_json(&serde_json::to_value(&plugins)?);
    }
    if plugins.is_empty() {
        println!(
            "no plugins registered (add one with `ratchet plugin add FILE.wasm`, or run `ratchet demo`)"
        );
    }
    for p in plugins {
        let yanked = if p.yanked { "  (yanked)" } else { "" };
        println!(
            "{:<16} {:<10} {}  {:>9} bytes{yanked}",
            p.name,
            p.version,
            &p.digest[..16],
            p.size
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn plugin_show(env: &Env, spec: &str, json: bool) -> Result<ExitCode> {
    let (name, version) = ratchet_runtime::registry::parse_plugin_spec(spec)?;
    let versions =
        ratchet_runtime::registry::plugin_versions(env.store.as_ref(), &name, version.as_ref())
            .await?;
    let mut shown = Vec::new();
    for p in versions {
        let runs = env.store.plugin_usage(&p.digest).await?;
        if json {
            shown.push(serde_json::json!({ "plugin": p, "runs_using_it": runs }));
            continue;
        }
        println!(
            "{}@{}{}",
            p.name,
            p.version,
            if p.yanked { "  (yanked)" } else { "" }
        );
        println!("  digest:        {}", p.digest);
        println!("  contract:      ratchet:stage@{}", p.contract);
        println!("  size:          {} bytes", p.size);
        println!("  registered at: {}", when::local(p.registered_at));
        println!("  runs using it: {runs}");
        println!("  manifest:");
        for line in p.manifest.lines() {
            println!("    {line}");
        }
    }
    if json {
        return print_json(&shown.into());
    }
    Ok(ExitCode::SUCCESS)
}

/// Every run, oldest first, read a page at a time.
async fn every_run(env: &Env) -> Result<Vec<RunRow>> {
    let mut query = RunQuery {
        limit: 1000,
        ..RunQuery::default()
    };
    let mut runs = Vec::new();
    loop {
        let page = env.client.runs(&query).await?;
        runs.extend(page.runs);
        match page.next_cursor {
            Some(cursor) => query.before = Some(cursor),
            None => break,
        }
    }
    runs.reverse();
    Ok(runs)
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

async fn plugin_names(env: &Env) -> Result<HashMap<String, PluginSummary>> {
    Ok(env
        .client
        .plugins()
        .await?
        .into_iter()
        .map(|p| (p.digest.clone(), p))
        .collect())
}

pub async fn status(env: &Env, run: Option<&str>, elements: bool, json: bool) -> Result<ExitCode> {
    let Some(run_id) = run else {
        let runs = every_run(env).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&runs)?);
        } else {
            println!("{:<38} {:<12} {:<10} CREATED", "RUN", "PIPELINE", "STATE");
            for r in runs {
                let created = when::local(r.created_at);
                println!("{:<38} {:<12} {:<10} {created}", r.id, r.pipeline, r.state);
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    let RunDetail { run, stages: jobs } = env.client.run(run_id).await?;
    // A mapped stage's elements, counted by state under it unless asked.
    let mut counts: HashMap<String, BTreeMap<&str, u64>> = HashMap::new();
    let jobs: Vec<JobRow> = if elements {
        jobs
    } else {
        let (each, jobs): (Vec<JobRow>, Vec<JobRow>) =
            jobs.into_iter().partition(|j| map::is_element(&j.stage));
        for j in &each {
            let mapped = j.stage.rsplit_once('[').map_or("", |(stage, _)| stage);
            let by_state = counts.entry(mapped.to_string()).or_default();
            *by_state.entry(j.state.as_str()).or_default() += 1;
        }
        jobs
    };
    let counted = |j: &JobRow| {
        counts.get(&j.stage).map(|by_state| {
            let states: Vec<String> = by_state.iter().map(|(s, n)| format!("{n} {s}")).collect();
            (by_state, states.join(", "))
        })
    };
    let mut artifacts = env.client.artifacts(run_id).await?;
    if !elements {
        // A list's elements, stored under its stage, go with the elements.
        artifacts.retain(|a| !map::is_element(&a.output));
    }
    let mut attempts: HashMap<i64, Vec<AttemptRow>> = HashMap::new();
    for a in env.client.attempts(run_id, None).await? {
        attempts.entry(a.job_id).or_default().push(a);
    }
    let attempts_of = |j: &JobRow| attempts.get(&j.id).map_or(&[][..], Vec::as_slice);
    // The journal's model calls by stage (a hidden element's under its
    // mapped stage), and the run's.
    let mut model: HashMap<String, ModelUse> = HashMap::new();
    let mut model_total = ModelUse::default();
    for call in env.client.model_calls(run_id).await? {
        let stage = match call.stage.rsplit_once('[') {
            Some((mapped, _)) if !elements && map::is_element(&call.stage) => mapped,
            _ => call.stage.as_str(),
        };
        model.entry(stage.to_string()).or_default().add(&call);
        model_total.add(&call);
    }
    let plugins = plugin_names(env).await?;
    let plugin_label = |j: &JobRow| match &j.plugin_digest {
        None => "(approval gate)".to_string(),
        Some(digest) => plugins
            .get(digest)
            .map(|p| format!("{}@{}", p.name, p.version))
            .unwrap_or_else(|| short(digest).to_string()),
    };
    if json {
        let stages: Vec<_> = jobs
            .iter()
            .map(|j| {
                let outputs: HashMap<&str, &str> = artifacts
                    .iter()
                    .filter(|a| a.stage == j.stage)
                    .map(|a| (a.output.as_str(), a.digest.as_str()))
                    .collect();
                serde_json::json!({
                    "stage": j.stage, "state": j.state, "attempts": j.attempt,
                    "plugin": plugin_label(j), "plugin_digest": j.plugin_digest,
                    "gate": j.gate, "artifacts": outputs, "last_error": j.last_error,
                    "map": j.map, "elements": counted(j).map(|(by_state, _)| by_state),
                    "model": model.get(&j.stage), "attempt_log": attempts_of(j),
                })
            })
            .collect();
        let history = env.client.history(run_id).await?;
        let deliveries = env.client.deliveries(&run_deliveries(run_id)).await?;
        let doc = serde_json::json!({
            "run": run, "stages": stages, "model": model_total, "history": history,
            "deliveries": deliveries,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("run {} ({}): {}", run.id, run.pipeline, run.state);
    println!(
        "{:<14} {:<10} {:>8}  {:<20} ARTIFACTS",
        "STAGE", "STATE", "ATTEMPTS", "PLUGIN"
    );
    for j in &jobs {
        let outs: Vec<String> = artifacts
            .iter()
            .filter(|a| a.stage == j.stage)
            .map(|a| format!("{}={}", a.output, short(&a.digest)))
            .collect();
        println!(
            "{:<14} {:<10} {:>8}  {:<20} {}",
            j.stage,
            j.state.as_str(),
            j.attempt,
            plugin_label(j),
            outs.join(" ")
        );
        for a in attempts_of(j) {
            println!("{:<14} {}", "", attempt_line(a));
        }
        if let Some(used) = model.get(&j.stage) {
            println!("{:<14} model: {used}", "");
        }
        if let (Some(list), Some((_, states))) = (&j.map, counted(j)) {
            let n = j.map_count.unwrap_or(0);
            println!(
                "{:<14} mapped over {list}: {n} element(s), {states} (`--elements` lists them)",
                ""
            );
        }
        if let Some(question) = j.gate.as_ref().filter(|_| j.state == JobState::Awaiting) {
            println!(
                "{:<14} awaits a decision: {} (ratchet approve|reject {} {})",
                "",
                escape_controls(question),
                run.id,
                j.stage
            );
        }
        if let Some(e) = &j.last_error {
            println!("{:<14} last error: {}", "", escape_controls(e));
        }
    }
    if model_total.calls > 0 {
        println!("model, the whole run: {model_total}");
    }
    for event in env.client.history(run_id).await? {
        println!(
            "history: {} ({})",
            escape_controls(&event.detail),
            when::local(event.at)
        );
    }
    for d in env.client.deliveries(&run_deliveries(run_id)).await? {
        let error = d.last_error.as_deref().map_or(String::new(), |e| {
            format!("; last error: {}", ratchet_runtime::text::bounded(e, 120))
        });
        println!(
            "delivery: {} to {}: {} after {} attempt(s){error}",
            d.event, d.sink, d.state, d.attempts
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Journaled model calls and the tokens their backends counted, and
/// journaled HTTP requests.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
struct ModelUse {
    calls: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    http_requests: u64,
}

impl ModelUse {
    fn add(&mut self, call: &ModelCall) {
        if call.kind == CallKind::Http {
            self.http_requests += 1;
            return;
        }
        self.calls += 1;
        let usage = call.usage.unwrap_or_default();
        self.prompt_tokens += u64::from(usage.prompt_tokens);
        self.completion_tokens += u64::from(usage.completion_tokens);
    }
}

impl std::fmt::Display for ModelUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} call(s), {} prompt and {} completion tokens",
            self.calls, self.prompt_tokens, self.completion_tokens
        )?;
        if self.http_requests > 0 {
            write!(f, ", {} HTTP request(s)", self.http_requests)?;
        }
        Ok(())
    }
}

/// One attempt of a stage: its number, outcome and worker, when it started
/// and how long it took, whether its proposal won, and its error.
fn attempt_line(a: &AttemptRow) -> String {
    let span = match a.finished_at {
        Some(end) => format!(
            "{}, took {}",
            when::local(a.claimed_at),
            when::took(end - a.claimed_at)
        ),
        None => format!("since {}", when::local(a.claimed_at)),
    };
    let proposal = match a.proposal_won {
        Some(true) => "; its proposal is the canonical artifact",
        Some(false) => "; its proposal lost to the stored artifact, which it continued from",
        None => "",
    };
    let error = a.error.as_deref().map_or(String::new(), |e| {
        format!("; error: {}", ratchet_runtime::text::bounded(e, 120))
    });
    format!(
        "attempt {} {} on {}, {span}{proposal}{error}",
        a.attempt,
        a.outcome,
        escape_controls(&a.worker)
    )
}

fn run_deliveries(run_id: &str) -> DeliveryFilter {
    DeliveryFilter {
        run_id: Some(run_id.to_string()),
        state: None,
    }
}

pub async fn artifacts(
    env: &Env,
    run_id: &str,
    which: Option<&str>,
    raw: bool,
    json: bool,
) -> Result<ExitCode> {
    let Some(which) = which else {
        let list = env.client.artifacts(run_id).await?;
        if json {
            return print_json(&serde_json::to_value(&list)?);
        }
        let plugins = plugin_names(env).await?;
        for a in list {
            let by = match a.plugin_digest.as_deref() {
                Some(d) => plugins
                    .get(d)
                    .map(|p| format!("{}@{} {}", p.name, p.version, short(d)))
                    .unwrap_or_else(|| short(d).to_string()),
                None => "-".to_string(),
            };
            println!(
                "{:<24} {:>8} bytes  {}  attempt {}  plugin {by}",
                format!("{}.{}", a.stage, a.output),
                a.size,
                a.digest,
                a.attempt
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let Some((stage, output)) = which.split_once('.') else {
        return Err(BadInput(format!("`{which}` is not STAGE.OUTPUT (e.g. draft.draft)")).into());
    };
    let artifact = env.client.artifact(run_id, stage, output).await?;
    if json {
        let text = std::str::from_utf8(&artifact.bytes).ok();
        return print_json(&serde_json::json!({ "artifact": artifact.meta, "text": text }));
    }
    if raw {
        std::io::stdout().write_all(&artifact.bytes)?;
    } else {
        println!(
            "{which}  {}  {} bytes  {}",
            artifact.meta.digest,
            artifact.meta.size,
            escape_controls(&artifact.meta.media_type)
        );
        // A plugin's text on a terminal: line by line, control characters
        // escaped (`--raw` gives the exact bytes).
        match std::str::from_utf8(&artifact.bytes) {
            Ok(text) => text
                .lines()
                .for_each(|line| println!("{}", escape_controls(line))),
            Err(_) => println!("(binary; use --raw)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn audit(
    env: &Env,
    run: Option<&str>,
    sinks: Option<&Sinks>,
    json: bool,
) -> Result<ExitCode> {
    if let Some(run_id) = run
        && env.store.run_get(run_id).await?.is_none()
    {
        return Err(BadInput(format!(
            "run `{run_id}` does not exist (list runs with `ratchet status`)"
        ))
        .into());
    }
    // Progress only where a person watches: on a terminal.
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} auditing: {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar
    });
    let mut progress = |r: &ratchet_runtime::audit::AuditReport| {
        if let Some(bar) = &bar {
            bar.set_message(format!(
                "{} runs, {} jobs, {} violations",
                r.runs,
                r.jobs,
                r.violations.len()
            ));
            bar.tick();
        }
    };
    let mut report =
        ratchet_runtime::audit::audit_store(env.store.as_ref(), run, &mut progress).await?;
    ratchet_runtime::audit::audit_deliveries(env.store.as_ref(), sinks, run, &mut report).await?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "audited {} runs, {} jobs, {} attempts, {} artifacts: {}",
            report.runs,
            report.jobs,
            report.attempts,
            report.artifacts,
            if report.is_clean() {
                "all invariants hold".to_string()
            } else {
                format!("{} violations", report.violations.len())
            }
        );
        for v in &report.violations {
            println!(
                "  [{}] run {} stage {}: {}",
                v.invariant, v.run_id, v.stage, v.detail
            );
        }
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
