//! `ratchet bench`: runs every scenario on SQLite, and on Postgres when a
//! URL is given, then prints a table or JSON keyed by backend.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Result;

use ratchet_bench::{self as bench, BenchConfig, Scratch};

pub struct BenchArgs {
    pub smoke: bool,
    pub postgres: Option<String>,
    pub nats: Option<String>,
    pub relay_events: Option<usize>,
    pub runs: Option<usize>,
    pub chain: Option<usize>,
    pub workers: Option<usize>,
    pub fanout: Option<usize>,
    pub json: bool,
    pub peer: bool,
    pub peer_runs: Option<usize>,
}

pub async fn run(args: BenchArgs) -> Result<ExitCode> {
    let mut config = if args.smoke {
        BenchConfig::smoke()
    } else {
        BenchConfig::full()
    };
    config.runs = args.runs.or(config.runs);
    config.chain = args.chain.unwrap_or(config.chain);
    config.workers = args.workers.unwrap_or(config.workers);
    config.fanout = args.fanout.unwrap_or(config.fanout);
    config.peer_runs = args.peer_runs.unwrap_or(config.peer_runs);
    config.nats = args.nats;
    config.relay_events = args.relay_events.unwrap_or(config.relay_events);
    let mut backends = vec![("sqlite", Scratch::sqlite()?)];
    if let Some(url) = &args.postgres {
        backends.push(("postgres", Scratch::postgres(url)?));
    }
    if args.peer {
        return peer(&config, backends, args.json).await;
    }
    let mut reports = BTreeMap::new();
    for (name, scratch) in backends {
        eprintln!("{name}:");
        let progress = |line: &str| eprintln!("  {line}");
        let report = bench::run_backend(&scratch, &config, &progress).await;
        scratch.cleanup().await?;
        reports.insert(name, report?);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        let columns: Vec<_> = reports.iter().map(|(n, r)| (*n, r)).collect();
        let runs = match config.runs {
            Some(runs) => format!("{runs} runs"),
            None => format!("{} s of runs", config.chain_seconds),
        };
        println!(
            "chains of {} stages ({runs}), {} workers, fan-out {} and {}\n",
            config.chain,
            config.workers,
            config.fanout / 10,
            config.fanout
        );
        print!("{}", bench::table(&columns));
    }
    Ok(ExitCode::SUCCESS)
}

/// Scenario 6 alone.
async fn peer(
    config: &BenchConfig,
    backends: Vec<(&'static str, Scratch)>,
    json: bool,
) -> Result<ExitCode> {
    let mut reports = BTreeMap::new();
    for (name, scratch) in backends {
        eprintln!("{name}:");
        let progress = |line: &str| eprintln!("  {line}");
        let report = bench::run_peer(&scratch, config, &progress).await;
        scratch.cleanup().await?;
        reports.insert(name, report?);
    }
    if json {
        let peer: BTreeMap<_, _> = reports
            .iter()
            .map(|(name, points)| (*name, serde_json::json!({ "peer": points })))
            .collect();
        println!("{}", serde_json::to_string_pretty(&peer)?);
    } else {
        println!(
            "{} workers, {} runs of each size\n",
            config.workers, config.peer_runs
        );
        let columns: Vec<_> = reports.iter().map(|(n, r)| (*n, r.as_slice())).collect();
        print!("{}", bench::peer_table(&columns));
    }
    Ok(ExitCode::SUCCESS)
}
