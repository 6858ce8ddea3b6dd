//! `ratchet demo`: the local value trap, shown on a real crash. A worker
//! process dies right after the model answered; the retry is handed the same
//! answer from the journal and the pipeline continues with it.

use std::process::ExitCode;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::Env;
use ratchet_runtime::bundled;
use ratchet_runtime::crash::CRASH_EXIT_CODE;
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::registry;
use ratchet_runtime::worker::{self, WorkerOptions};

const CRASH_LEASE_MS: &str = "1500";

pub async fn run(env: &Env, runs: u32) -> Result<ExitCode> {
    println!("Ratchet demo on {}\n", env.db);
    let names = register(env, &bundled::PLUGINS).await?;
    println!("1. Registered the bundled plugins: {}.", names.join(", "));

    let pipeline = Pipeline::parse("plugins/demo.toml", bundled::DEMO_PIPELINE)?;
    let mut run_ids = Vec::new();
    for i in 1..=runs {
        let input = format!("release {i} of the demo").into_bytes();
        let outcome = registry::run_submit(
            env.store.as_ref(),
            &pipeline,
            input,
            None,
            &env.limits,
            env.clock.as_ref(),
        )
        .await?;
        run_ids.push(outcome.run_id().to_string());
    }
    println!(
        "2. Submitted {runs} runs of pipeline `demo` (draft -> verify, publish -> prepare-next)."
    );

    let crashed = crash_a_worker(
        env,
        "after_model_call",
        "right after its first model call",
        "answer journaled, stage not finished",
    )
    .await?;
    println!("4. Running workers in this process until every run is finished...");
    println!("   {}.\n", work_until_idle(env).await?);

    if crashed {
        tell_the_story(env, &run_ids).await?;
    }
    summary_table(env, &run_ids).await?;
    let inspect = "Inspect a run with `ratchet status RUN` and `ratchet artifacts RUN draft.draft`, \
         or see it in the dashboard: `ratchet serve`, then open http://127.0.0.1:8080/.";
    Ok(if audit_told(env, inspect).await? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Starts `ratchet worker` as a child process that exits at crash point
/// `point` (`where_` says where that is, `left` what it leaves behind).
/// Returns whether it crashed there.
pub(crate) async fn crash_a_worker(
    env: &Env,
    point: &str,
    where_: &str,
    left: &str,
) -> Result<bool> {
    if !cfg!(feature = "failpoints") {
        println!(
            "3. (This build has no crash points; skipping the crash. Build with default features to see it.)"
        );
        return Ok(false);
    }
    let exe = std::env::current_exe().context("cannot find the ratchet executable")?;
    println!("3. Starting a worker process that will die {where_}");
    println!("   (FAILPOINTS={point}=return(exit)): {left}.");
    // The child runs with this process's global options: the same
    // database, policy, component cache and model backend.
    let status = tokio::process::Command::new(exe)
        .args(&env.global_args)
        .args(["worker", "--until-idle", "--concurrency", "1"])
        .args([
            "--lease-ms",
            CRASH_LEASE_MS,
            "--worker-id",
            "demo-doomed-worker",
        ])
        .env("FAILPOINTS", format!("{point}=return(exit)"))
        .env("RATCHET_LOG", "error")
        .status()
        .await
        .context("cannot start the worker process")?;
    let crashed = status.code() == Some(CRASH_EXIT_CODE);
    if crashed {
        println!("   The worker process died (exit code {CRASH_EXIT_CODE}).");
    } else {
        println!("   The worker process ended without crashing ({status}).");
    }
    Ok(crashed)
}

/// Registers bundled plugins; their `name@version`.
pub(crate) async fn register(env: &Env, plugins: &[(&str, &[u8])]) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for (_, bytes) in plugins {
        let r = registry::plugin_register(
            env.store.as_ref(),
            &env.host,
            bytes.to_vec(),
            env.clock.as_ref(),
        )
        .await?;
        names.push(format!("{}@{}", r.manifest.name, r.manifest.version));
    }
    Ok(names)
}

/// Runs four workers in this process until no work is left; their
/// summary.
pub(crate) async fn work_until_idle(env: &Env) -> Result<String> {
    let sched = env.scheduler(crate::default_worker_id(), 60_000);
    let opts = WorkerOptions {
        concurrency: 4,
        until_idle: true,
        ..WorkerOptions::default()
    };
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let stats = worker::run(env.store.clone(), sched, env.clock.clone(), opts, stopped).await?;
    Ok(stats.summary())
}

/// The audit of every run, told; whether it is clean.
pub(crate) async fn audit_told(env: &Env, inspect: &str) -> Result<bool> {
    let report = ratchet_runtime::audit::audit_store(env.store.as_ref(), None, &mut |_| {}).await?;
    if report.is_clean() {
        println!(
            "\nAudit: all three invariants hold over {} runs, {} jobs, {} attempts (`ratchet audit`).",
            report.runs, report.jobs, report.attempts
        );
        println!("{inspect}");
        return Ok(true);
    }
    println!("\nAudit FAILED:");
    for v in &report.violations {
        println!(
            "  [{}] run {} stage {}: {}",
            v.invariant, v.run_id, v.stage, v.detail
        );
    }
    Ok(false)
}

async fn json_artifact(env: &Env, run: &str, stage: &str, output: &str) -> Result<Value> {
    let a = env
        .store
        .artifact_get(run, stage, output)
        .await?
        .with_context(|| format!("run {run} has no {stage}.{output}"))?;
    Ok(serde_json::from_slice(&a.bytes)?)
}

async fn tell_the_story(env: &Env, run_ids: &[String]) -> Result<()> {
    for run in run_ids {
        let calls = env.store.model_call_list(run).await?;
        let Some(call) = calls.iter().find(|c| c.stage == "draft" && c.attempt == 1) else {
            continue;
        };
        let attempts = env.store.attempt_list(run).await?;
        let draft_attempts: Vec<_> = attempts.iter().filter(|a| a.stage == "draft").collect();
        if draft_attempts.len() < 2 {
            continue;
        }
        let draft = env
            .store
            .artifact_get(run, "draft", "draft")
            .await?
            .context("draft missing")?;
        let digest = &draft.meta.digest;
        let same = draft.bytes == call.response.as_bytes();
        let verify = json_artifact(env, run, "verify", "report").await?;
        let receipt = json_artifact(env, run, "publish", "receipt").await?;
        let next = json_artifact(env, run, "prepare-next", "next").await?;
        let events = env.store.outbox_list(Some(run)).await?;
        let check = |v: &Value| {
            if v.as_str() == Some(digest.as_str()) {
                "yes"
            } else {
                "NO"
            }
        };
        println!("What happened to run {run}:");
        println!("   attempt 1 of `draft` asked the model and got:");
        println!(
            "      \"{}\"",
            ratchet_runtime::text::escape_controls(&call.response)
        );
        println!(
            "   the host journaled that answer (model_calls, call #0), then the process died."
        );
        println!(
            "   attempt {} of `draft` (worker {}) made the same call; the host replayed the",
            draft.meta.attempt,
            draft_attempts
                .last()
                .map(|a| a.worker.as_str())
                .unwrap_or("?")
        );
        println!(
            "   journaled answer instead of drawing a new one from a non-deterministic model."
        );
        println!(
            "   committed draft: sha256 {}; equal to attempt 1's answer: {}",
            digest,
            if same { "yes" } else { "NO" }
        );
        println!(
            "   verify consumed it:        {}",
            check(&verify["draft_sha256"])
        );
        println!(
            "   publish consumed it:       {}",
            check(&receipt["draft_sha256"])
        );
        println!(
            "   prepare-next consumed it:  {}",
            check(&next["published_sha256"])
        );
        println!(
            "   `draft.published` outbox events: {} (payload names the draft digest: {})\n",
            events
                .iter()
                .filter(|e| e.event == "draft.published")
                .count(),
            if events.iter().any(|e| e.payload.contains(digest.as_str())) {
                "yes"
            } else {
                "NO"
            }
        );
        return Ok(());
    }
    println!("(No run shows a replayed model answer; the crash hit before the journal.)\n");
    Ok(())
}

async fn summary_table(env: &Env, run_ids: &[String]) -> Result<()> {
    println!(
        "{:<38} {:<10} {:>6} {:>7} {:>8} {:>13}  DRAFT",
        "RUN", "STATE", "draft", "verify", "publish", "prepare-next"
    );
    for run in run_ids {
        let Some(row) = env.store.run_get(run).await? else {
            continue;
        };
        let jobs = env.store.job_list(run).await?;
        let attempts = |stage: &str| {
            jobs.iter()
                .find(|j| j.stage == stage)
                .map(|j| {
                    format!(
                        "{}x{}",
                        j.state.as_str().chars().next().unwrap_or('?'),
                        j.attempt
                    )
                })
                .unwrap_or_default()
        };
        let draft = env.store.artifact_get(run, "draft", "draft").await?;
        println!(
            "{:<38} {:<10} {:>6} {:>7} {:>8} {:>13}  {}",
            run,
            row.state,
            attempts("draft"),
            attempts("verify"),
            attempts("publish"),
            attempts("prepare-next"),
            draft
                .map(|d| d.meta.digest[..12].to_string())
                .unwrap_or_default()
        );
    }
    println!("(per stage: state initial x attempts; s = succeeded)");
    Ok(())
}
