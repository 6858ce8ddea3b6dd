//! A relay's round claims several events of a run and sends them one after
//! another: it stops before a send that could outlast the round's lease,
//! and the events it held back wait for the next round with their attempts
//! given back. On every backend, against a real webhook receiver, with a
//! clock that each request moves on by the sink's timeout.
//!
//! Checked on a buggy shape, seen failing here (on SQLite): a round that
//! sends its run's events whatever the lease sent all six in the first
//! round, each request saw no delivery recorded yet, and the assertion on
//! what each request saw failed. (Attempts not given back to held-back
//! events fail `relay.rs`'s dead-sink check.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use ratchet_runtime::clock::ManualClock;
use ratchet_runtime::relay::{Relay, RelayConfig, Sinks};
use ratchet_runtime::store::{DeliveryFilter, DeliveryState};
use ratchet_tests::events::{commit_chains, verified};
use ratchet_tests::{BOUND, Backend, Harness};
use tokio::sync::watch;

ratchet_tests::backend_tests! {
    a_round_stops_before_a_send_could_outlast_its_lease => lease_bounds_a_round;
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const TIMEOUT_MS: i64 = 1_000;
/// Two and a half timeouts: a round's third send could end after it.
const LEASE_MS: i64 = 2_500;
const EMITS: [&str; 5] = ["a.one", "a.two", "a.three", "a.four", "a.five"];

struct Receiver {
    h: Harness,
    clock: Arc<ManualClock>,
    /// Each request's event id, and how many deliveries were recorded
    /// delivered when it came.
    seen: Mutex<Vec<(String, usize)>>,
}

async fn hooks(
    State(r): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let Some((_, id)) = verified(SECRET, &headers, &body) else {
        return StatusCode::UNAUTHORIZED;
    };
    let rows = r.h.store.delivery_list(&DeliveryFilter::default()).await;
    let delivered = rows
        .unwrap_or_default()
        .iter()
        .filter(|d| d.state == DeliveryState::Delivered)
        .count();
    r.clock.advance(TIMEOUT_MS);
    r.seen
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push((id, delivered));
    StatusCode::NO_CONTENT
}

async fn lease_bounds_a_round(backend: Backend) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(backend, clock.clone()).await else {
        return;
    };
    let events = commit_chains(&h, 1, &EMITS).await;
    let ids = events.into_values().next().expect("one run");
    assert_eq!(ids.len(), EMITS.len() + 1, "five events and run.succeeded");
    let receiver = Arc::new(Receiver {
        h,
        clock,
        seen: Mutex::default(),
    });
    let app = axum::Router::new()
        .route("/hooks", axum::routing::post(hooks))
        .with_state(receiver.clone());
    let addr = ratchet_tests::serve_http(app).await;

    let h = &receiver.h;
    let sinks = Sinks::parse(
        "sinks.toml",
        &format!(
            "[[sink]]\nname = \"hooks\"\ntype = \"webhook\"\nurl = \"http://{addr}/hooks\"\nsecret_env = \"S\"\nevents = [\"*\"]\ntimeout_ms = {TIMEOUT_MS}\n"
        ),
    )
    .expect("sinks file");
    let mut config = RelayConfig::new("lanes");
    config.lease_ms = LEASE_MS;
    config.poll = Duration::from_millis(5);
    let env = |_: &str| Some(SECRET.to_string());
    let relay = Relay::new(h.store.clone(), &sinks, &env, h.clock.clone(), config).expect("relay");
    let (_stop, stopped) = watch::channel(false);
    tokio::time::timeout(BOUND, Arc::new(relay).run(true, stopped))
        .await
        .expect("idle within the bound")
        .expect("relay ran");

    let seen = receiver
        .seen
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    let order: Vec<&String> = seen.iter().map(|(id, _)| id).collect();
    assert_eq!(
        order,
        ids.iter().collect::<Vec<_>>(),
        "commit order, once each"
    );
    // Two sends fit in a lease of two and a half timeouts: each request
    // finds the rounds before its own recorded.
    let recorded: Vec<usize> = seen.iter().map(|(_, n)| *n).collect();
    assert_eq!(
        recorded,
        [0, 0, 2, 2, 4, 4],
        "deliveries recorded per request"
    );
    let rows = h
        .store
        .delivery_list(&DeliveryFilter::default())
        .await
        .expect("deliveries");
    assert!(
        rows.iter()
            .all(|d| d.state == DeliveryState::Delivered && d.attempts == 1),
        "each delivered at its first attempt: {rows:?}"
    );
}
