//! Relays killed by SIGKILL while they deliver: real `ratchet relay`
//! processes (three on PostgreSQL, one on SQLite) deliver 600 committed
//! events to a signed webhook receiver (axum on 127.0.0.1) and to a NATS
//! JetStream stream, and one of them is killed each time one of the sinks
//! (the two in turns) has received another share of the events (the
//! relays' own progress, not a timer), then started again. Afterwards the stream holds exactly one message per
//! event, the receiver has seen every event and nothing else, and each
//! run's events arrived in commit order at both sinks (the first time each
//! arrived; a redelivery repeats an event, never overtakes one).
//!
//! Seen failing with the claim's check for an earlier pending delivery of
//! the same run and sink removed (on SQLite: a run's events reached the
//! stream out of commit order), and with the `Nats-Msg-Id` header left off
//! (no message on the stream carried its event's id, and the test waited
//! out its bound).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use futures_util::StreamExt;
use ratchet_runtime::store::{DeliveryFilter, DeliveryState};
use ratchet_tests::events::{commit_chains, verified};
use ratchet_tests::nats::{jetstream, stream_messages};
use ratchet_tests::{BOUND, Backend, Harness, output, ratchet};
use tokio::sync::watch;

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const RUNS: usize = 100;
/// Each run's stages' events; with its `run.succeeded`, six per run.
const EMITS: [&str; 5] = [
    "draft.made",
    "draft.checked",
    "draft.published",
    "index.updated",
    "note.sent",
];
/// A killed relay's deliveries are claimed again after this.
const LEASE_MS: &str = "1500";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_killed_on_postgres_lose_nothing_and_duplicate_nothing() {
    chaos(Backend::Postgres, 3, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_on_sqlite_loses_nothing_and_duplicates_nothing() {
    chaos(Backend::Sqlite, 1, 3).await;
}

/// What the webhook receiver saw, in arrival order.
struct Receiver {
    seen: Mutex<Vec<(String, String)>>,
    bad_signatures: Mutex<u64>,
    count: watch::Sender<usize>,
}

async fn hook(
    State(r): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let Some(event) = verified(SECRET, &headers, &body) else {
        *lock(&r.bad_signatures) += 1;
        return StatusCode::UNAUTHORIZED;
    };
    lock(&r.seen).push(event);
    r.count.send_modify(|n| *n += 1);
    StatusCode::NO_CONTENT
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Each run's ids in the order they first arrived.
fn first_arrivals<'a>(
    arrivals: impl Iterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (run, id) in arrivals {
        if seen.insert(id.to_string()) {
            order
                .entry(run.to_string())
                .or_default()
                .push(id.to_string());
        }
    }
    order
}

fn relay(url: &str, sinks: &std::path::Path, id: usize) -> tokio::process::Child {
    let mut cmd = ratchet(BIN, url);
    cmd.env("CHAOS_SECRET", SECRET)
        .arg("--sinks")
        .arg(sinks)
        .args([
            "relay",
            "--relay-id",
            &format!("relay-{id}"),
            "--lease-ms",
            LEASE_MS,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd.spawn().expect("spawn a relay")
}

async fn chaos(backend: Backend, relays: usize, kills: usize) {
    let Some((nats_url, js)) = jetstream().await else {
        return;
    };
    let Some(h) = Harness::on(backend, Arc::new(ratchet_runtime::clock::SystemClock)).await else {
        return;
    };
    let events = commit_chains(&h, RUNS, &EMITS).await;
    let total: usize = events.values().map(Vec::len).sum();
    assert!(total >= 500, "{total} events");

    let (count, _) = watch::channel(0);
    let receiver = Arc::new(Receiver {
        seen: Mutex::new(Vec::new()),
        bad_signatures: Mutex::new(0),
        count,
    });
    let app = axum::Router::new()
        .route("/hooks", axum::routing::post(hook))
        .with_state(receiver.clone());
    let addr = ratchet_tests::serve_http(app).await;

    // Every message published on the stream's subjects, duplicates the
    // stream drops included: a core subscriber sees them all.
    let tag = format!("chaos{backend:?}{}", std::process::id()).to_lowercase();
    let (stream, prefix) = (format!("RATCHET_{tag}"), tag.clone());
    let _ = js.delete_stream(&stream).await;
    let client = async_nats::connect(&nats_url).await.expect("nats");
    let mut published = client
        .subscribe(format!("{prefix}.>"))
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let (published_count, mut published_seen) = watch::channel(Vec::<String>::new());
    tokio::spawn(async move {
        while let Some(m) = published.next().await {
            let id = m
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|v| v.as_str().to_string())
                .unwrap_or_default();
            published_count.send_modify(|ids| ids.push(id));
        }
    });

    let dir = tempfile::tempdir().expect("temp dir");
    let sinks = dir.path().join("sinks.toml");
    std::fs::write(
        &sinks,
        format!(
            "[[sink]]\nname = \"hooks\"\ntype = \"webhook\"\nurl = \"http://{addr}/hooks\"\nsecret_env = \"CHAOS_SECRET\"\nevents = [\"*\"]\ntimeout_ms = 1000\nbackoff_ms = 10\nmax_backoff_ms = 100\n\n\
             [[sink]]\nname = \"bus\"\ntype = \"nats\"\nurl = \"{nats_url}\"\nstream = \"{stream}\"\nsubject = \"{prefix}.{{event}}\"\ncreate_stream = true\nevents = [\"*\"]\ntimeout_ms = 1000\nbackoff_ms = 10\nmax_backoff_ms = 100\n"
        ),
    )
    .expect("sinks file");

    let mut children: Vec<_> = (0..relays).map(|i| relay(&h.url, &sinks, i)).collect();
    let mut seen = receiver.count.subscribe();
    let share = total / (kills + 1);
    for kill in 0..kills {
        // In turns, at the JetStream sink's progress and at the webhook's:
        // the two go at their own speeds, and each must be hit mid-way.
        let target = (kill + 1) * share;
        let progressed = async {
            if kill % 2 == 0 {
                published_seen
                    .wait_for(|ids| ids.len() >= target)
                    .await
                    .map(|_| ())
            } else {
                seen.wait_for(|n| *n >= target).await.map(|_| ())
            }
        };
        tokio::time::timeout(BOUND, progressed)
            .await
            .expect("the relays progress within the bound")
            .expect("progress");
        let victim = kill % relays;
        children[victim].kill().await.expect("SIGKILL a relay");
        children[victim] = relay(&h.url, &sinks, relays + kill);
    }
    let unique = |ids: &[String]| ids.iter().collect::<BTreeSet<_>>().len();
    tokio::time::timeout(BOUND, published_seen.wait_for(|ids| unique(ids) >= total))
        .await
        .expect("every event published within the bound")
        .expect("subscriber");
    for child in &mut children {
        child.kill().await.expect("stop a relay");
    }
    // What the killed relays left leased is delivered once the leases lapse.
    let mut last = ratchet(BIN, &h.url);
    last.env("CHAOS_SECRET", SECRET)
        .arg("--sinks")
        .arg(&sinks)
        .args(["relay", "--until-idle", "--lease-ms", LEASE_MS]);
    let done = output(last).await;
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );

    let deliveries = h
        .store
        .delivery_list(&DeliveryFilter::default())
        .await
        .expect("deliveries");
    assert_eq!(deliveries.len(), 2 * total);
    assert!(
        deliveries
            .iter()
            .all(|d| d.state == DeliveryState::Delivered),
        "every delivery delivered"
    );
    let keys: BTreeSet<&String> = events.values().flatten().collect();

    let stored = stream_messages(&js, &stream).await;
    let _ = js.delete_stream(&stream).await;
    let stored_ids: Vec<&String> = stored.iter().map(|(_, id, _)| id).collect();
    assert_eq!(
        stored_ids.len(),
        total,
        "one message per event in the stream"
    );
    assert_eq!(stored_ids.iter().copied().collect::<BTreeSet<_>>(), keys);
    let run_of = |body: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|e| e["run"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let stream_runs: Vec<(String, &String)> = stored
        .iter()
        .map(|(_, id, body)| (run_of(body), id))
        .collect();
    assert_eq!(
        first_arrivals(stream_runs.iter().map(|(r, id)| (r.as_str(), id.as_str()))),
        events,
        "commit order per run in the stream"
    );

    let arrived = lock(&receiver.seen).clone();
    assert_eq!(*lock(&receiver.bad_signatures), 0);
    let arrived_ids: BTreeSet<&String> = arrived.iter().map(|(_, id)| id).collect();
    assert_eq!(
        arrived_ids, keys,
        "every event, and only events, at the receiver"
    );
    assert_eq!(
        first_arrivals(arrived.iter().map(|(r, id)| (r.as_str(), id.as_str()))),
        events,
        "commit order per run at the receiver"
    );

    let published_total = published_seen.borrow().len();
    eprintln!(
        "relay chaos on {backend:?}: {relays} relays, {kills} SIGKILLs, {total} events; \
         the stream absorbed {} redelivered messages ({published_total} published, {total} stored); \
         the receiver saw {} duplicates ({} requests)",
        published_total - total,
        arrived.len() - total,
        arrived.len()
    );
}
