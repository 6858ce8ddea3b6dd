//! Ratchet inside a Rust program, through `ratchet_runtime::client`:
//! register the demo's stages, submit a run of the demo pipeline (twice,
//! with one idempotency key: one run), run a worker in this program's
//! tokio runtime, wait for the run, print its published receipt, and stop
//! the worker gracefully.
//!
//! `cargo run -p ratchet-example-embed [DATABASE_URL]` (default: a SQLite
//! file in a temporary folder).

use std::time::Duration;

use anyhow::Context;
use ratchet_runtime::bundled;
use ratchet_runtime::client::Client;
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::worker::WorkerOptions;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = match std::env::args().nth(1) {
        Some(url) => url,
        None => {
            let dir = std::env::temp_dir().join(format!("ratchet-embed-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            format!("sqlite://{}", dir.join("embed.db").display())
        }
    };
    let client = Client::open(&url).await.context("open the database")?;
    for (_, component) in bundled::PLUGINS {
        client.register(component.to_vec()).await?;
    }
    let pipeline = Pipeline::parse("plugins/demo.toml", bundled::DEMO_PIPELINE)?;
    let key = Some(format!("embed-{}", std::process::id()));
    let run = client
        .submit(&pipeline, b"embedding".to_vec(), key.clone())
        .await?;
    let again = client.submit(&pipeline, b"embedding".to_vec(), key).await?;
    assert_eq!(again.run_id, run.run_id, "one key, one run");

    let worker = client.worker("embedded", WorkerOptions::default());
    let finished = client.wait(&run.run_id, Duration::from_secs(120)).await?;
    let receipt = client.artifact(&run.run_id, "publish", "receipt").await?;
    println!("run {} {}", finished.id, finished.state);
    println!(
        "publish.receipt: {}",
        String::from_utf8_lossy(&receipt.bytes)
    );
    let stats = worker.stop(Duration::from_secs(30)).await?;
    println!("worker stopped: {}", stats.summary());
    Ok(())
}
