//! The `ratchet` command line: `main`, and what each command does. Its
//! arguments are in `args.rs`, an error's line and exit code in `exit.rs`,
//! what every command opens in `env.rs`, an operator's commands on a run in
//! `operate.rs`, a worker's stop signal in
//! `signal.rs`. Bad input gets one line on stderr and exit code 2; a failed
//! audit exits 1.

mod args;
mod bench;
mod demo;
mod demo_map;
mod env;
mod exit;
mod inspect;
mod operate;
mod relay;
pub mod serve;
mod signal;
mod when;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;

pub use args::{Cli, Command, ModelArgs, ModelKind, OutboxCommand, PluginCommand};
pub use env::{Env, default_worker_id};
pub use exit::BadInput;
use exit::{exit_code, one_line};
use signal::shutdown_signal;

use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::registry;
use ratchet_runtime::relay::RelayConfig;
use ratchet_runtime::store::PluginPutOutcome;
use ratchet_runtime::worker::{self, WorkerOptions};

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let rendered = e.render().to_string();
            let first = rendered
                .lines()
                .next()
                .unwrap_or("error: invalid arguments");
            eprintln!("{first} (see `ratchet --help`)");
            return ExitCode::from(2);
        }
    };
    let default_level = if matches!(cli.command, Command::Worker { .. } | Command::Relay { .. }) {
        "info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RATCHET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colour only for a terminal, and never when NO_COLOR is set
    // (no-color.org: any value but the empty string).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    if let Err(e) = ratchet_runtime::crash::setup_from_env() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}

async fn dispatch(cli: Cli) -> Result<ExitCode> {
    if let Command::Bench {
        smoke,
        postgres,
        nats,
        relay_events,
        runs,
        chain,
        workers,
        fanout,
        json,
        peer,
        peer_runs,
    } = &cli.command
    {
        let size = |v: &Option<u64>| v.map(|v| v as usize);
        let args = bench::BenchArgs {
            smoke: *smoke,
            postgres: postgres.clone(),
            nats: nats.clone(),
            relay_events: size(relay_events),
            runs: size(runs),
            chain: size(chain),
            workers: size(workers),
            fanout: size(fanout),
            json: *json,
            peer: *peer,
            peer_runs: size(peer_runs),
        };
        return bench::run(args).await;
    }
    // A bad sinks file is refused before anything is opened or changed.
    if let Some(path) = &cli.sinks {
        relay::load_sinks(path)?;
    } else if matches!(cli.command, Command::Relay { .. }) {
        return Err(BadInput(
            "`ratchet relay` needs a sinks file: --sinks FILE or RATCHET_SINKS (see docs/relay.md)"
                .into(),
        )
        .into());
    }
    if let Command::Plugin(PluginCommand::Add { file, .. }) = &cli.command {
        // Read the file before opening (and perhaps creating) the database.
        if !file.is_file() {
            return Err(BadInput(format!("cannot read `{}`: no such file", file.display())).into());
        }
    }
    // An address `serve` must not answer on without a token is refused
    // before the database is opened.
    let token = match &cli.command {
        Command::Serve { listen } => serve::token(*listen)?,
        _ => None,
    };
    let env = Env::open(&cli).await?;
    match cli.command {
        Command::Demo {
            map_reduce: true, ..
        } => demo_map::run(&env).await,
        Command::Demo { runs, .. } => demo::run(&env, runs).await,
        Command::Plugin(PluginCommand::Add { file, json }) => {
            let bytes = std::fs::read(&file)
                .map_err(|e| BadInput(format!("cannot read `{}`: {e}", file.display())))?;
            let registered = env
                .client
                .register(bytes)
                .await
                .with_context(|| format!("`{}` was not registered", file.display()))?;
            let (name, version) = (&registered.manifest.name, &registered.manifest.version);
            let inserted = registered.outcome == PluginPutOutcome::Inserted;
            if json {
                return inspect::print_json(&serde_json::json!({
                    "name": name, "version": version, "digest": registered.digest,
                    "registered": inserted,
                }));
            }
            let verb = if inserted {
                "registered"
            } else {
                "already registered"
            };
            println!("{verb} {name}@{version} ({})", registered.digest);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::List { json }) => inspect::plugin_list(&env, json).await,
        Command::Plugin(PluginCommand::Show { plugin, json }) => {
            inspect::plugin_show(&env, &plugin, json).await
        }
        Command::Plugin(PluginCommand::Yank { plugin, json }) => {
            let (name, version) = registry::parse_plugin_spec(&plugin)?;
            let Some(version) = version else {
                return Err(BadInput(format!(
                    "name the version to yank: `ratchet plugin yank {name}@VERSION`"
                ))
                .into());
            };
            registry::plugin_versions(env.store.as_ref(), &name, Some(&version)).await?;
            env.store.plugin_yank(&name, &version.to_string()).await?;
            if json {
                let doc = serde_json::json!({ "name": name, "version": version.to_string(), "yanked": true });
                return inspect::print_json(&doc);
            }
            println!(
                "yanked {name}@{version}: new runs no longer resolve it; runs pinned to it keep it"
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            pipeline,
            input,
            idempotency_key,
            json,
        } => {
            let text = std::fs::read_to_string(&pipeline)
                .map_err(|e| BadInput(format!("cannot read `{}`: {e}", pipeline.display())))?;
            let parsed = Pipeline::parse(&pipeline.display().to_string(), &text)?;
            let input = match input {
                Some(path) => std::fs::read(&path).map_err(|e| {
                    BadInput(format!("cannot read input `{}`: {e}", path.display()))
                })?,
                None => Vec::new(),
            };
            let submitted = env.client.submit(&parsed, input, idempotency_key).await?;
            if json {
                return inspect::print_json(&serde_json::to_value(&submitted)?);
            }
            println!("{}", submitted.run_id);
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker {
            concurrency,
            until_idle,
            lease_ms,
            worker_id,
            grace_secs,
            metrics_listen,
        } => {
            let worker_id = worker_id.unwrap_or_else(default_worker_id);
            if let Some(addr) = metrics_listen {
                let store = env.store.clone();
                let bound = serve::metrics::listen(addr, store, env.clock.clone()).await?;
                println!("metrics on http://{bound}/metrics");
            }
            let relay = match &cli.sinks {
                Some(path) => Some(relay::relay(
                    &env,
                    path,
                    RelayConfig::new(worker_id.clone()),
                )?),
                None => None,
            };
            let sched = env.scheduler(worker_id.clone(), lease_ms as i64);
            let opts = WorkerOptions {
                concurrency: concurrency as usize,
                until_idle,
                ..WorkerOptions::default()
            };
            let stop_signal = shutdown_signal()?;
            tracing::info!(worker = %worker_id, concurrency, "worker started");
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let relaying = relay.map(|r| tokio::spawn(r.run(false, stopped.clone())));
            let mut work = tokio::spawn(worker::run(
                env.store.clone(),
                sched,
                env.clock.clone(),
                opts,
                stopped,
            ));
            let stats = tokio::select! {
                joined = &mut work => joined??,
                _ = stop_signal => {
                    tracing::info!("stopping: letting in-flight attempts finish (up to {grace_secs} s)");
                    let _ = stop.send(true);
                    match tokio::time::timeout(Duration::from_secs(grace_secs), &mut work).await {
                        Ok(joined) => joined??,
                        Err(_) => {
                            work.abort();
                            tracing::warn!("abandoned in-flight attempts; their leases will expire and they will be retried");
                            return Ok(ExitCode::SUCCESS);
                        }
                    }
                }
            };
            tracing::info!("worker stopped: {}", stats.summary());
            if let Some(relaying) = relaying {
                let _ = stop.send(true);
                let relayed = relaying.await??;
                tracing::info!("relay stopped: {}", relayed.summary());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Relay {
            until_idle,
            relay_id,
            lease_ms,
        } => {
            let path = cli.sinks.as_deref().context("checked above")?;
            let relay_id = relay_id.unwrap_or_else(default_worker_id);
            let mut config = RelayConfig::new(relay_id.clone());
            config.lease_ms = lease_ms as i64;
            let relay = relay::relay(&env, path, config)?;
            let stop_signal = shutdown_signal()?;
            tracing::info!(relay = %relay_id, "relay started");
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let mut relaying = tokio::spawn(relay.run(until_idle, stopped));
            let stats = tokio::select! {
                joined = &mut relaying => joined??,
                _ = stop_signal => {
                    let _ = stop.send(true);
                    relaying.await??
                }
            };
            tracing::info!("relay stopped: {}", stats.summary());
            Ok(ExitCode::SUCCESS)
        }
        Command::Outbox {
            action: Some(OutboxCommand::Redeliver { id, dead, json }),
            ..
        } => relay::redeliver(&env, id, dead, json).await,
        Command::Outbox {
            action: None,
            run,
            state,
            json,
        } => {
            let state = relay::parse_state(state.as_deref())?;
            relay::list(&env, run, state, json).await
        }
        Command::Status {
            run,
            elements,
            json,
        } => inspect::status(&env, run.as_deref(), elements, json).await,
        Command::Artifacts {
            run,
            artifact,
            raw,
            json,
        } => inspect::artifacts(&env, &run, artifact.as_deref(), raw, json).await,
        Command::Audit { run, json } => {
            let sinks = cli.sinks.as_deref().map(relay::load_sinks).transpose()?;
            inspect::audit(&env, run.as_deref(), sinks.as_ref(), json).await
        }
        Command::Upgrade {
            run,
            stage,
            to,
            json,
        } => {
            let digest =
                registry::stage_upgrade(env.store.as_ref(), &run, &stage, &to, env.clock.as_ref())
                    .await?;
            if json {
                let doc = serde_json::json!({
                    "run": run, "stage": stage, "version": to.to_string(), "digest": digest,
                });
                return inspect::print_json(&doc);
            }
            println!("stage `{stage}` of run {run} now runs version {to} ({digest})");
            Ok(ExitCode::SUCCESS)
        }
        command @ (Command::Cancel { .. }
        | Command::Retry { .. }
        | Command::Approve { .. }
        | Command::Reject { .. }) => operate::run(&env, command).await,
        Command::Bench { .. } => Err(anyhow::anyhow!(
            "`bench` runs on scratch databases and is dispatched before `--db` is opened"
        )),
        command @ Command::Reconcile { .. } => operate::run(&env, command).await,
        Command::Serve { listen } => serve::run(env.client.clone(), listen, token).await,
    }
}
