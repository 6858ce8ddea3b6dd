//! `ratchet demo --map-reduce`: a text split into paragraphs, each
//! summarised by the model in a job of its own, the summaries joined in
//! order, and the digest published once approved (`plugins/map-reduce.toml`).
//! A worker process dies inside the transaction that stores the list and
//! creates its jobs: nothing of it stays, and the retry creates them once.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::Env;
use crate::demo::{audit_told, crash_a_worker, register, work_until_idle};
use ratchet_runtime::bundled;
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::store::{JobState, Verdict, map};
use ratchet_runtime::{operator, registry};

/// The text the example summarises, one paragraph per element.
const TEXT: &str = "\
Ratchet runs pipelines whose stages are sandboxed WebAssembly components.

A stage proposes artifacts; the host stores the first one canonical-first and passes only the stored value downstream.

Dependencies are durable edges in the database, not the order jobs were enqueued in.

Every artifact commits with its continuation in one transaction, and a reconciler repairs whatever slips.

A mapped stage gets one job per element of a list, created in the transaction that released it.";

pub async fn run(env: &Env) -> Result<ExitCode> {
    println!("Ratchet map-reduce demo on {}\n", env.db);
    let names = register(env, &bundled::MAP_REDUCE_PLUGINS).await?;
    println!(
        "1. Registered the map-reduce plugins: {}.",
        names.join(", ")
    );
    let pipeline = Pipeline::parse("plugins/map-reduce.toml", bundled::MAP_REDUCE_PIPELINE)?;
    let outcome = registry::run_submit(
        env.store.as_ref(),
        &pipeline,
        TEXT.as_bytes().to_vec(),
        None,
        &env.limits,
        env.clock.as_ref(),
    )
    .await?;
    let run = outcome.run_id().to_string();
    println!(
        "2. Submitted run {run}: split -> summarise (mapped over split.parts) -> join -> review (approval) -> publish."
    );
    crash_a_worker(
        env,
        "after_map_expand",
        "inside the transaction that stores `split.parts` and creates a job per paragraph",
        "list, elements and jobs written, not committed",
    )
    .await?;
    let split = env.store.artifact_get(&run, "split", "parts").await?;
    println!(
        "   Stored after the crash: `split.parts` {}, element jobs {}.",
        if split.is_some() { "yes" } else { "no" },
        elements(env, &run).await?
    );
    println!("4. Running workers in this process until only the approval is left...");
    println!("   {}.", work_until_idle(env).await?);
    println!(
        "   `summarise` ran as {} element jobs, each created once.",
        elements(env, &run).await?
    );
    let digest = env
        .store
        .artifact_get(&run, "join", "digest")
        .await?
        .context("join stored no digest")?;
    println!("   The joined digest, in paragraph order:");
    for line in String::from_utf8_lossy(&digest.bytes).lines() {
        println!("      {}", ratchet_runtime::text::escape_controls(line));
    }
    let review = env.store.job_list(&run).await?;
    let awaiting = review
        .iter()
        .any(|j| j.stage == "review" && j.state == JobState::Awaiting);
    println!(
        "5. Gate `review` awaits a decision: {}; approving it as `demo` (`ratchet approve {run} review`).",
        if awaiting { "yes" } else { "NO" }
    );
    operator::gate_decide(
        env.store.as_ref(),
        &run,
        "review",
        Verdict::Approved,
        "demo".into(),
        Some("the digest matches the text".into()),
        env.clock.as_ref(),
    )
    .await?;
    println!("   {}.", work_until_idle(env).await?);
    let state = env
        .store
        .run_get(&run)
        .await?
        .context("the run is gone")?
        .state;
    println!("6. Run {run}: {state}.");
    let inspect = format!(
        "Inspect it with `ratchet status {run}` (`--elements` lists the paragraphs' jobs) and `ratchet artifacts {run} summarise.summary`."
    );
    Ok(if audit_told(env, &inspect).await? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// How many element jobs the run has.
async fn elements(env: &Env, run: &str) -> Result<usize> {
    let jobs = env.store.job_list(run).await?;
    Ok(jobs.iter().filter(|j| map::is_element(&j.stage)).count())
}
