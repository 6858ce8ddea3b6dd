//! What an operator does to a run: cancel it, retry it, decide its
//! approval gates; and the reconcile. Each answers in one line, or in JSON
//! with `--json`.

use std::process::ExitCode;

use anyhow::Result;

use ratchet_runtime::operator;
use ratchet_runtime::store::{ReconcileReport, Verdict};

use crate::args::DecisionArgs;
use crate::{Command, Env, inspect};

pub async fn run(env: &Env, command: Command) -> Result<ExitCode> {
    let client = &env.client;
    match command {
        Command::Cancel {
            run,
            reason,
            by,
            json,
        } => {
            let by = by.unwrap_or_else(operator::os_user);
            let (in_flight, waiting) = client.cancel(&run, reason, by).await?;
            if json {
                let doc = serde_json::json!({
                    "run": run, "state": "cancelled", "in_flight": in_flight, "waiting": waiting,
                });
                return inspect::print_json(&doc);
            }
            println!(
                "run {run} cancelled: {in_flight} attempt(s) in flight fenced out, {waiting} stage(s) will not start"
            );
        }
        Command::Retry {
            run,
            stage,
            fresh,
            by,
            json,
        } => {
            let by = by.unwrap_or_else(operator::os_user);
            let retried = client.retry(&run, stage, fresh, by).await?;
            if json {
                return inspect::print_json(&serde_json::json!({ "run": run, "retried": retried }));
            }
            println!(
                "run {run} is running again (generation {}): {} resumed; {} journaled model answer(s) discarded",
                retried.generation,
                retried.stages.join(", "),
                retried.journal_discarded
            );
        }
        Command::Approve {
            run,
            stage,
            decision,
        } => return decide(env, &run, &stage, Verdict::Approved, decision).await,
        Command::Reject {
            run,
            stage,
            decision,
        } => return decide(env, &run, &stage, Verdict::Rejected, decision).await,
        Command::Reconcile { json } => {
            let report = env.store.reconcile(env.clock.now_ms()).await?;
            if json {
                return inspect::print_json(&serde_json::to_value(&report)?);
            }
            println!("{}", reconciled(&report));
        }
        other => anyhow::bail!("`{other:?}` is not an operator's command"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn decide(
    env: &Env,
    run: &str,
    stage: &str,
    verdict: Verdict,
    args: DecisionArgs,
) -> Result<ExitCode> {
    let by = args.by.unwrap_or_else(operator::os_user);
    let decision = (env.client)
        .decide(run, stage, verdict, by, args.note)
        .await?;
    if args.json {
        return inspect::print_json(
            &serde_json::json!({ "run": run, "stage": stage, "decision": decision }),
        );
    }
    let then = match verdict {
        Verdict::Approved => "the stages after it run",
        Verdict::Rejected => "the run failed",
    };
    println!(
        "gate `{stage}` of run {run} {} by {}: {then}",
        verdict.as_str(),
        decision.by
    );
    Ok(ExitCode::SUCCESS)
}

/// What a reconcile did, in one sentence.
fn reconciled(r: &ReconcileReport) -> String {
    let repaired: Vec<String> = [
        (
            r.dead_expired_leases,
            "job(s) dead whose lease lapsed on their last attempt",
        ),
        (r.pending_repaired, "waiting stage(s) recounted or released"),
        (r.edges_repaired, "edge(s) of succeeded stages satisfied"),
        (
            r.runs_finished,
            "run(s) finished whose every stage had succeeded",
        ),
        (
            r.gates_timed_out,
            "approval gate(s) rejected on their timeout",
        ),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    let transactions = r.transactions;
    if repaired.is_empty() {
        return format!("reconcile: nothing to repair ({transactions} transaction(s))");
    }
    format!(
        "reconcile: {} ({transactions} transaction(s))",
        repaired.join("; ")
    )
}
