//! Per-call cost of a cached component: a fresh instance plus one `run`
//! call, the work every attempt does, with wasmtime's on-demand allocator
//! and with its pooling allocator; and the cost of getting the component in
//! a new worker: compiling it, or loading it precompiled from the disk
//! cache. A benchmark, not a test: it prints.
//!
//!     cargo bench -p ratchet-bench --bench instantiate
//!
//! `RATCHET_BENCH_CALLS` sets the calls per allocator (default 5000);
//! `RATCHET_BENCH_COMPONENT=path.wasm` measures another component too (the
//! Python stage, say; its inputs are left empty).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratchet_runtime::bundled::PLUGIN_DIR;
use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::llm::StochasticModel;
use ratchet_runtime::plugin::{HostConfig, Invocation, PluginHost};

fn main() -> anyhow::Result<()> {
    let calls: usize = std::env::var("RATCHET_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut components = vec![("noop".to_string(), format!("{PLUGIN_DIR}/noop.wasm"))];
    if let Ok(path) = std::env::var("RATCHET_BENCH_COMPONENT") {
        components.push((path.clone(), path));
    }
    println!("{calls} calls each; per call = new instance + `run` + output checks\n");
    println!(
        "{:<12} {:<10} {:>10} {:>10} {:>10}",
        "component", "allocator", "mean µs", "p50 µs", "p99 µs"
    );
    for (name, path) in &components {
        let bytes = std::fs::read(path)?;
        let (compile, load) = runtime.block_on(startup(&bytes))?;
        println!(
            "{:<12} new worker: compile {:.1} ms, load precompiled {:.1} ms",
            short(name),
            compile.as_secs_f64() * 1e3,
            load.as_secs_f64() * 1e3
        );
        for (label, pooling) in [("on-demand", None), ("pooling", Some(64))] {
            let mut t = runtime.block_on(measure(&bytes, pooling, calls))?;
            t.sort();
            let mean = t.iter().sum::<Duration>() / t.len() as u32;
            let pct = |p: f64| t[((t.len() - 1) as f64 * p) as usize];
            println!(
                "{:<12} {:<10} {:>10.1} {:>10.1} {:>10.1}",
                short(name),
                label,
                micros(mean),
                micros(pct(0.5)),
                micros(pct(0.99))
            );
        }
    }
    Ok(())
}

/// Time to a usable component (including its `describe` call) in a worker
/// with an empty cache folder, then in one with a warm cache folder.
async fn startup(bytes: &[u8]) -> anyhow::Result<(Duration, Duration)> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = ratchet_runtime::store::open(&url).await?;
    let mut times = Vec::new();
    for _ in 0..2 {
        let config = HostConfig {
            cache_dir: Some(dir.path().join("components")),
            ..HostConfig::default()
        };
        let host = PluginHost::new(
            store.clone(),
            Arc::new(StochasticModel),
            Arc::new(SystemClock),
            config,
        )?;
        let start = Instant::now();
        host.inspect(bytes).await?;
        times.push(start.elapsed());
    }
    Ok((times[0], times[1]))
}

async fn measure(
    bytes: &[u8],
    pooling: Option<u32>,
    calls: usize,
) -> anyhow::Result<Vec<Duration>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = ratchet_runtime::store::open(&url).await?;
    let config = HostConfig {
        pooling,
        ..HostConfig::default()
    };
    let host = PluginHost::new(
        store,
        Arc::new(StochasticModel),
        Arc::new(SystemClock),
        config,
    )?;
    let plugin = host.inspect(bytes).await?;
    let inv = Invocation {
        run_id: "bench".into(),
        stage: "bench".into(),
        attempt: 1,
        idempotency_key: "bench".into(),
        started_at_ms: 0,
    };
    // Warm up: first-touch page faults and lazy initialisation.
    for _ in 0..calls / 10 {
        let _ = host.execute(&plugin, &inv, Vec::new()).await;
    }
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        let outcome = host.execute(&plugin, &inv, Vec::new()).await;
        times.push(start.elapsed());
        std::hint::black_box(outcome.is_ok());
    }
    Ok(times)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn short(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}
