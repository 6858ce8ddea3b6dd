//! (8) The relay against NATS JetStream, with the raw limit of the same
//! server measured in the same run: publishes acknowledged per second at
//! the relay's concurrency and pipelining (`claim_runs` publishers side by
//! side, as the relay sends that many runs at once, each waiting for its
//! acknowledgement before its next publish, as a run's events go one after
//! another), against events delivered per second by a relay working off a
//! backlog of committed events; and the time from an event's commit to its
//! acknowledgement, events committed one at a time while the relay runs.
//! The raw limit is measured just before the relay and again just after
//! it, and the ratio is to their mean: on a machine whose cores the NATS
//! server shares, the limit drifts between runs about as much as a change
//! to the relay moves it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, message::PublishMessage, stream};
use serde::Serialize;
use tokio::sync::watch;

use crate::rig::{Rig, chain_pipeline, rig};
use crate::{BenchConfig, Scratch, ms, per_s, percentile};
use ratchet_runtime::relay::{Relay, RelayConfig, Sinks, envelope};
use ratchet_runtime::store::{
    ArtifactPut, DeliveryFilter, DeliveryState, RawCompletion, StoreError,
};

/// Runs the backlog is spread over, per run a relay sends at once.
const RUNS_PER_SEND: usize = 4;

/// Scenario 8's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RelayPoint {
    pub events: usize,
    /// Publishes (and acknowledgements) in flight at once: the runs a
    /// relay's round sends side by side.
    pub in_flight: usize,
    /// The mean of the raw limit measured before and after the relay.
    pub raw_publishes_per_s: f64,
    pub raw_before_per_s: f64,
    pub raw_after_per_s: f64,
    pub relay_events_per_s: f64,
    /// `relay_events_per_s / raw_publishes_per_s`.
    pub ratio: f64,
    pub commit_to_ack_p50_ms: f64,
    pub commit_to_ack_p99_ms: f64,
    /// CPU time of this process per raw publish, in µs, over both
    /// measurements: the publishers and the NATS client (`None` off Linux).
    pub raw_cpu_us_per_publish: Option<f64>,
    /// CPU time of this process per event the relay delivered, in µs: the
    /// relay, the NATS client and the store's client, and on SQLite the
    /// database itself (a PostgreSQL server's own is not in it). Steadier
    /// from run to run than events per second on a machine the NATS server
    /// shares.
    pub relay_cpu_us_per_event: Option<f64>,
    /// CPU time of the whole machine per raw publish, in µs, over both
    /// measurements: the publishers, the NATS client and the NATS server
    /// (`None` off Linux).
    pub raw_machine_cpu_us_per_publish: Option<f64>,
    /// CPU time of the whole machine per event the relay delivered, in µs:
    /// the relay, the NATS server and the database server too. Where the
    /// relay and the raw limit are both bound by the machine's CPUs, the
    /// ratio follows the two machine figures' ratio.
    pub relay_machine_cpu_us_per_event: Option<f64>,
}

pub(crate) async fn relay(
    scratch: &Scratch,
    config: &BenchConfig,
    nats: &str,
) -> anyhow::Result<RelayPoint> {
    let rig = rig(scratch, "relay", 1).await?;
    // The relay keeps each run's events in commit order, one in flight per
    // run and sink: the backlog is spread over four runs per run a round
    // sends, as events of many runs are.
    let pipeline = chain_pipeline(1)?;
    let mut runs = Vec::new();
    for i in 0..RUNS_PER_SEND * RelayConfig::new("bench").claim_runs {
        runs.push(
            rig.submit(&pipeline, format!("relay {i}").into_bytes())
                .await?,
        );
    }
    let job_id = rig.store.job_list(&runs[0]).await?[0].id;
    let js = jetstream::new(async_nats::connect(nats).await?);
    let tag = format!("{}{}", std::process::id(), rig.clock.now_ms());
    let name = format!("RATCHET_BENCH_{tag}");
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("bench-{tag}.>")],
        ..Default::default()
    })
    .await?;
    let measured = measure(&rig, (nats, &js), &tag, (&runs, job_id), config).await;
    js.delete_stream(&name).await?;
    measured
}

async fn measure(
    rig: &Rig,
    (nats, js): (&str, &jetstream::Context),
    tag: &str,
    (runs, job_id): (&[String], i64),
    config: &BenchConfig,
) -> anyhow::Result<RelayPoint> {
    let events = config.relay_events;
    let relay_config = RelayConfig::new("bench");
    let in_flight = relay_config.claim_runs;

    for i in 0..events {
        let run = &runs[i % runs.len()];
        commit_event(rig, run, job_id, &format!("backlog-{i}")).await?;
    }
    // The raw limit publishes what the relay will: each event's envelope
    // on its subject (under `raw.`, and with an id of its own, so that the
    // stream does not take the relay's, or the other measurement's, as
    // duplicates of them).
    let messages: Vec<(String, String, Vec<u8>)> = rig
        .store
        .outbox_list(None)
        .await?
        .iter()
        .map(|e| {
            let subject = format!("bench-{tag}.raw.{}", e.event);
            (subject, e.dedup_key.clone(), envelope(e))
        })
        .collect();
    let messages = Arc::new(messages);
    let before = raw_limit(js, &messages, in_flight, "raw-before").await?;

    let sinks = Sinks::parse(
        "bench-sinks.toml",
        &format!(
            "[[sink]]\nname = \"bus\"\ntype = \"nats\"\nurl = \"{nats}\"\nsubject = \"bench-{tag}.{{event}}\"\nevents = [\"*\"]\n"
        ),
    )?;
    let new_relay = |config: RelayConfig| {
        Relay::new(
            rig.store.clone(),
            &sinks,
            &|_| None,
            rig.clock.clone(),
            config,
        )
        .map(Arc::new)
    };
    let (stop, stopped) = watch::channel(false);
    let (start, cpu) = (Instant::now(), Cpu::now());
    new_relay(relay_config.clone())?
        .run(true, stopped.clone())
        .await?;
    let relayed = per_s(events, start.elapsed());
    let relay_cpu = cpu.per(events);
    let after = raw_limit(js, &messages, in_flight, "raw-after").await?;
    let raw = mean(before.per_s, after.per_s);
    let raw_cpu = before.cpu.mean(&after.cpu);

    // Latency: the relay runs as it does beside a worker, and events are
    // committed one at a time.
    let running = tokio::spawn(new_relay(relay_config)?.run(false, stopped));
    let mut committed = HashMap::new();
    for i in 0..config.latency_samples {
        let run = &runs[i % runs.len()];
        let key = commit_event(rig, run, job_id, &format!("trickle-{i}")).await?;
        committed.insert(key, rig.clock.now_ms());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let latencies = loop {
        let delivered = delivered_at(rig).await?;
        let samples: Vec<Duration> = committed
            .iter()
            .filter_map(|(key, at)| {
                let ms = delivered.get(key)? - at;
                Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
            })
            .collect();
        if samples.len() == committed.len() {
            break samples;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = stop.send(true);
    running.await??;
    let mut latencies = latencies;
    latencies.sort();
    Ok(RelayPoint {
        events,
        in_flight,
        raw_publishes_per_s: raw,
        raw_before_per_s: before.per_s,
        raw_after_per_s: after.per_s,
        relay_events_per_s: relayed,
        ratio: relayed / raw.max(1e-9),
        commit_to_ack_p50_ms: ms(percentile(&latencies, 0.5)),
        commit_to_ack_p99_ms: ms(percentile(&latencies, 0.99)),
        raw_cpu_us_per_publish: raw_cpu.process,
        relay_cpu_us_per_event: relay_cpu.process,
        raw_machine_cpu_us_per_publish: raw_cpu.machine,
        relay_machine_cpu_us_per_event: relay_cpu.machine,
    })
}

/// One measurement of the raw limit: publishes per second, and CPU time
/// per publish.
struct Raw {
    per_s: f64,
    cpu: CpuPer,
}

/// Publishes `messages` from `in_flight` publishers side by side, each
/// awaiting its acknowledgement before its next publish, each message with
/// its key under `prefix` for an id.
async fn raw_limit(
    js: &jetstream::Context,
    messages: &Arc<Vec<(String, String, Vec<u8>)>>,
    in_flight: usize,
    prefix: &str,
) -> anyhow::Result<Raw> {
    let ids: Arc<Vec<String>> = Arc::new(
        messages
            .iter()
            .map(|(_, key, _)| format!("{prefix}-{key}"))
            .collect(),
    );
    let (start, cpu) = (Instant::now(), Cpu::now());
    let mut publishers = tokio::task::JoinSet::new();
    for lane in 0..in_flight {
        let (js, messages, ids) = (js.clone(), messages.clone(), ids.clone());
        publishers.spawn(async move {
            for i in (lane..messages.len()).step_by(in_flight) {
                let (subject, _, body) = &messages[i];
                let publish = PublishMessage::build()
                    .payload(body.clone().into())
                    .message_id(&ids[i]);
                js.send_publish(subject.clone(), publish).await?.await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = publishers.join_next().await {
        done??;
    }
    Ok(Raw {
        per_s: per_s(messages.len(), start.elapsed()),
        cpu: cpu.per(messages.len()),
    })
}

/// CPU time used so far, where Linux says (`None` elsewhere).
struct Cpu {
    process: Option<Duration>,
    machine: Option<Duration>,
}

/// CPU time per item since a [`Cpu`], in µs.
struct CpuPer {
    process: Option<f64>,
    machine: Option<f64>,
}

impl Cpu {
    fn now() -> Self {
        Self {
            process: process_cpu(),
            machine: machine_cpu(),
        }
    }

    fn per(&self, items: usize) -> CpuPer {
        let per = |before: Option<Duration>, now: Option<Duration>| {
            let used = now?.saturating_sub(before?);
            Some(used.as_secs_f64() * 1e6 / items.max(1) as f64)
        };
        CpuPer {
            process: per(self.process, process_cpu()),
            machine: per(self.machine, machine_cpu()),
        }
    }
}

impl CpuPer {
    /// The mean of two measurements, where both have a figure.
    fn mean(&self, other: &Self) -> Self {
        let both = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| mean(a, b));
        Self {
            process: both(self.process, other.process),
            machine: both(self.machine, other.machine),
        }
    }
}

fn mean(a: f64, b: f64) -> f64 {
    (a + b) / 2.0
}

/// CPU time this process's threads have run so far, summed from each one's
/// `/proc/self/task/TID/schedstat` (nanoseconds on a CPU; a thread that
/// ended is not in it).
fn process_cpu() -> Option<Duration> {
    let mut ns = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        // A thread may end between the listing and the read.
        if let Ok(text) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) {
            ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(Duration::from_nanos(ns))
}

/// CPU time every core of the machine has spent busy so far, from the
/// first line of `/proc/stat`: user, nice, system, irq and softirq time,
/// in its clock ticks of 10 ms (`USER_HZ` is 100 on every Linux this
/// builds for).
fn machine_cpu() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = text
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq …
    let busy = [0, 1, 2, 5, 6]
        .iter()
        .map(|&i| ticks.get(i))
        .sum::<Option<u64>>()?;
    Some(Duration::from_millis(busy * 10))
}

/// Commits one event with the statement shape of a completion (the raw
/// limit's); returns its dedup key.
async fn commit_event(rig: &Rig, run: &str, job_id: i64, name: &str) -> anyhow::Result<String> {
    let bytes = name.as_bytes().to_vec();
    let payload = ratchet_runtime::plugin::Payload::new(name, "text/plain", bytes);
    let put = ArtifactPut {
        run_id: run,
        stage: "raw",
        artifact: &payload,
        attempt: 1,
        plugin_digest: None,
        now: rig.clock.now_ms(),
    };
    rig.store
        .raw_completion(RawCompletion { job_id, put })
        .await?;
    Ok(format!("{run}/{name}/raw"))
}

/// When each delivered event was acknowledged, by dedup key.
async fn delivered_at(rig: &Rig) -> Result<HashMap<String, i64>, StoreError> {
    let filter = DeliveryFilter {
        run_id: None,
        state: Some(DeliveryState::Delivered),
    };
    Ok(rig
        .store
        .delivery_list(&filter)
        .await?
        .into_iter()
        .filter_map(|d| Some((d.dedup_key, d.delivered_at?)))
        .collect())
}
