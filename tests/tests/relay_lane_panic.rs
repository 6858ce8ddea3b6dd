//! A lane that panics takes nothing else down: a real `ratchet relay
//! --until-idle` whose first send panics (the crash point
//! `relay_before_send` set to `1*panic`) goes on sending on its other
//! lanes, sends the panicked lane's run again once its lease lapses, and
//! ends with every event delivered, on every backend.
//!
//! A sink's lanes are futures its loop polls (ADR 0042), not tasks of
//! their own, so a panic in one unwinds into the loop unless the lane
//! catches it. Seen failing on SQLite with the lane's `catch_unwind`
//! removed: the panic ended the sink's loop, the relay exited 0 with that
//! sink's deliveries still pending, and the assertion that every delivery
//! was delivered failed.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use ratchet_runtime::store::{DeliveryFilter, DeliveryState};
use ratchet_tests::events::{commit_chains, verified};
use ratchet_tests::{Backend, Harness, output, ratchet};

ratchet_tests::backend_tests! {
    a_lane_that_panics_loses_nothing_and_stops_nothing_else => lane_panics;
}

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// More runs than one lane holds, each with its `run.succeeded` too.
const RUNS: usize = 8;
const EMITS: [&str; 2] = ["draft.made", "draft.published"];

/// Ids the receiver accepted, each with its run, in arrival order.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

async fn hook(State(seen): State<Seen>, headers: HeaderMap, body: axum::body::Bytes) -> StatusCode {
    match verified(SECRET, &headers, &body) {
        Some(event) => {
            seen.lock().expect("not poisoned").push(event);
            StatusCode::NO_CONTENT
        }
        None => StatusCode::UNAUTHORIZED,
    }
}

async fn lane_panics(backend: Backend) {
    let clock = Arc::new(ratchet_runtime::clock::SystemClock);
    let Some(h) = Harness::on(backend, clock).await else {
        return;
    };
    let events = commit_chains(&h, RUNS, &EMITS).await;
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/hooks", axum::routing::post(hook))
        .with_state(seen.clone());
    let addr = ratchet_tests::serve_http(app).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let sinks = dir.path().join("sinks.toml");
    std::fs::write(
        &sinks,
        format!(
            "[[sink]]\nname = \"hooks\"\ntype = \"webhook\"\nurl = \"http://{addr}/hooks\"\nsecret_env = \"PANIC_SECRET\"\nevents = [\"*\"]\ntimeout_ms = 1000\n"
        ),
    )
    .expect("sinks file");

    let mut relay = ratchet(BIN, &h.url);
    relay
        .env("PANIC_SECRET", SECRET)
        .env("FAILPOINTS", "relay_before_send=1*panic")
        .arg("--sinks")
        .arg(&sinks)
        .args(["relay", "--until-idle", "--lease-ms", "1500"]);
    let done = output(relay).await;
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{stderr}");
    assert!(
        stderr.contains("relay_before_send"),
        "the lane panicked: {stderr}"
    );

    let deliveries = h
        .store
        .delivery_list(&DeliveryFilter::default())
        .await
        .expect("deliveries");
    let total: usize = events.values().map(Vec::len).sum();
    assert_eq!(deliveries.len(), total);
    assert!(
        deliveries
            .iter()
            .all(|d| d.state == DeliveryState::Delivered),
        "every delivery delivered: {:?}",
        deliveries
            .iter()
            .filter(|d| d.state != DeliveryState::Delivered)
            .map(|d| (&d.dedup_key, d.state))
            .collect::<Vec<_>>()
    );
    let received: BTreeSet<String> = seen
        .lock()
        .expect("not poisoned")
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    let committed: BTreeSet<String> = events.values().flatten().cloned().collect();
    assert_eq!(
        received, committed,
        "the receiver saw every event and no other"
    );
}
