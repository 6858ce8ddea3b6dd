//! The relay: every committed event delivered to the sinks that take it,
//! at least once, in commit order per run and sink (docs/relay.md).
//!
//! A router marks each new outbox event routed and gives it one delivery
//! per sink that takes it, in one transaction. Each sink then has a loop
//! of its own: it claims due deliveries with a lease, a run at a time (the
//! run's earliest pending one and the next few after it), sends each run's
//! one after another and the runs side by side (a signed webhook POST, or a
//! JetStream publish and its acknowledgement), and records the round's
//! results with the next claim in one transaction, each under its lease. A
//! slow or dead sink only ever holds up itself.

mod envelope;
mod nats;
mod send;
mod sinks;
mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::clock::Clock;
use crate::store::{
    ClaimedDelivery, Deliveries, DeliveryClaim, DeliveryFinish, DeliveryResult, NewDelivery,
    OutboxRow, Routing, StoreError,
};
pub use envelope::envelope;
pub use nats::SubjectTemplate;
pub use sinks::{EventPattern, SinkConfig, SinkKind, Sinks};
pub use webhook::WebhookSecret;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("sink `{sink}`: {message}")]
    Sink { sink: String, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How a relay claims and waits.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Recorded on the leases it takes; host + pid by default.
    pub relay_id: String,
    /// Longer than any sink's timeout: a lease lapses only when its relay
    /// is gone.
    pub lease_ms: i64,
    /// Runs a sink's loop claims at once: the deliveries it has in flight.
    pub claim_runs: usize,
    /// Deliveries of one run a claim takes, sent one after another.
    pub claim_per_run: usize,
    /// Events routed per transaction.
    pub route_page: usize,
    /// How long a sink's loop with nothing due waits before it looks again
    /// (new events wake it sooner).
    pub poll: Duration,
    /// How long the router waits before it looks for new events again.
    pub route_poll: Duration,
}

impl RelayConfig {
    pub fn new(relay_id: impl Into<String>) -> Self {
        Self {
            relay_id: relay_id.into(),
            lease_ms: 60_000,
            claim_runs: 64,
            claim_per_run: 16,
            route_page: 512,
            poll: Duration::from_millis(200),
            route_poll: Duration::from_millis(50),
        }
    }
}

/// What a relay did, counted as it works.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub routed: AtomicU64,
    pub delivered: AtomicU64,
    pub retried: AtomicU64,
    pub dead: AtomicU64,
    /// Deliveries a JetStream stream acknowledged as duplicates of a
    /// message it already held: redeliveries its window absorbed.
    pub duplicates: AtomicU64,
    /// Results dropped because another relay had taken the lease over.
    pub lease_lost: AtomicU64,
}

impl RelayStats {
    pub fn summary(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} routed, {} delivered ({} absorbed as duplicates), {} retries, {} dead letters, {} results after a lost lease",
            n(&self.routed),
            n(&self.delivered),
            n(&self.duplicates),
            n(&self.retried),
            n(&self.dead),
            n(&self.lease_lost)
        )
    }
}

/// How one send ended, before the retry policy is applied.
#[derive(Debug)]
pub(crate) enum Sent {
    /// `duplicate`: the sink said it already had the event.
    Delivered {
        status: Option<i64>,
        duplicate: bool,
    },
    /// Worth another attempt (a timeout, a refused connection, 408, 429, 5xx).
    Retryable { status: Option<i64>, error: String },
    /// The sink refused the event for good (another 4xx, a redirect).
    Refused { status: Option<i64>, error: String },
}

impl Sent {
    fn retry(status: Option<i64>, error: String) -> Self {
        Self::Retryable { status, error }
    }
}

#[derive(Debug)]
enum Transport {
    Webhook(webhook::Webhook),
    /// Boxed: its connection is built lazily and is much larger.
    Nats(Box<nats::Nats>),
}

#[derive(Debug)]
struct Sink {
    config: SinkConfig,
    transport: Transport,
}

/// The relay of one process.
pub struct Relay {
    store: Arc<dyn Deliveries>,
    sinks: Vec<Arc<Sink>>,
    clock: Arc<dyn Clock>,
    config: RelayConfig,
    stats: Arc<RelayStats>,
}

impl Relay {
    /// A relay for `sinks`, each webhook's secret read through `env`.
    pub fn new(
        store: Arc<dyn Deliveries>,
        sinks: &Sinks,
        env: &dyn Fn(&str) -> Option<String>,
        clock: Arc<dyn Clock>,
        config: RelayConfig,
    ) -> Result<Self, RelayError> {
        let mut built = Vec::with_capacity(sinks.sinks.len());
        for sink in &sinks.sinks {
            let fail = |message: String| RelayError::Sink {
                sink: sink.name.clone(),
                message,
            };
            let transport = match &sink.kind {
                SinkKind::Webhook {
                    url,
                    secret_env,
                    timeout,
                } => {
                    let text = env(secret_env).ok_or_else(|| {
                        fail(format!(
                            "the environment variable `{secret_env}` is not set; set it to the sink's `whsec_` secret"
                        ))
                    })?;
                    let secret = WebhookSecret::parse(&text)
                        .map_err(|why| fail(format!("`{secret_env}` {why}")))?;
                    Transport::Webhook(webhook::Webhook::new(url, secret, *timeout).map_err(fail)?)
                }
                SinkKind::Nats {
                    url,
                    subject,
                    create_stream,
                    timeout,
                } => Transport::Nats(Box::new(nats::Nats::new(
                    url,
                    subject.clone(),
                    create_stream.clone(),
                    *timeout,
                ))),
            };
            let timeout = sink.kind.timeout();
            if timeout.as_millis() as i64 >= config.lease_ms {
                return Err(fail(format!(
                    "`timeout_ms` ({} ms) is not below the relay's lease ({} ms); lower it",
                    timeout.as_millis(),
                    config.lease_ms
                )));
            }
            built.push(Arc::new(Sink {
                config: sink.clone(),
                transport,
            }));
        }
        Ok(Self {
            store,
            sinks: built,
            clock,
            config,
            stats: Arc::default(),
        })
    }

    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Routes every event not yet routed, a page per transaction; returns
    /// how many.
    pub async fn route(&self) -> Result<usize, StoreError> {
        let mut routed = 0;
        loop {
            let events = self.store.outbox_unrouted(self.config.route_page).await?;
            if events.is_empty() {
                return Ok(routed);
            }
            let routing = self.routing(&events);
            self.store.deliveries_route(&routing).await?;
            routed += events.len();
            self.stats
                .routed
                .fetch_add(events.len() as u64, Ordering::Relaxed);
            if events.len() < self.config.route_page {
                return Ok(routed);
            }
        }
    }

    fn routing(&self, events: &[OutboxRow]) -> Routing {
        let deliveries = events
            .iter()
            .flat_map(|e| {
                self.sinks
                    .iter()
                    .filter(|s| s.config.takes(&e.event))
                    .map(|s| NewDelivery {
                        outbox_id: e.id,
                        sink: s.config.name.clone(),
                        run_id: e.run_id.clone(),
                    })
            })
            .collect();
        Routing {
            events: events.iter().map(|e| e.id).collect(),
            deliveries,
            now: self.clock.now_ms(),
        }
    }

    /// One round of sink `index`: records the last round's results
    /// (`sent`) and claims its due deliveries in one transaction, then sends
    /// them, each run's in order and the runs together, and leaves their
    /// results in `sent` for the next round (or [`Self::record`]). Returns
    /// how many it claimed. On an error, `sent` is kept to be recorded
    /// again.
    async fn deliver_round(
        &self,
        index: usize,
        sent: &mut Vec<(ClaimedDelivery, DeliveryResult)>,
    ) -> Result<usize, StoreError> {
        let sink = &self.sinks[index];
        let claim = DeliveryClaim {
            relay: self.config.relay_id.clone(),
            sinks: vec![sink.config.name.clone()],
            now: self.clock.now_ms(),
            lease_ms: self.config.lease_ms,
            runs: self.config.claim_runs,
            per_run: self.config.claim_per_run,
        };
        let claimed = self.record(&sink.config.name, sent, Some(&claim)).await?;
        let count = claimed.len();
        let mut runs: BTreeMap<String, Vec<ClaimedDelivery>> = BTreeMap::new();
        for delivery in claimed {
            runs.entry(delivery.event.run_id.clone())
                .or_default()
                .push(delivery);
        }
        let lease_end = claim.now + claim.lease_ms;
        let mut lanes = tokio::task::JoinSet::new();
        for run in runs.into_values() {
            let (sink, clock, stats) = (sink.clone(), self.clock.clone(), self.stats.clone());
            lanes.spawn(async move {
                send::send_run(&sink, run, lease_end, clock.as_ref(), &stats).await
            });
        }
        while let Some(done) = lanes.join_next().await {
            // A run's sends that panicked: their leases lapse and they are
            // retried.
            if let Ok(results) = done {
                sent.extend(results);
            }
        }
        Ok(count)
    }

    /// Records `sent` (emptying it) and, with `claim`, claims the next
    /// deliveries, in one transaction.
    async fn record(
        &self,
        sink: &str,
        sent: &mut Vec<(ClaimedDelivery, DeliveryResult)>,
        claim: Option<&DeliveryClaim>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let now = self.clock.now_ms();
        let finished: Vec<DeliveryFinish> = sent
            .iter()
            .map(|(delivery, result)| DeliveryFinish {
                id: delivery.id,
                relay: self.config.relay_id.clone(),
                attempts: delivery.attempts,
                result: result.clone(),
                now,
            })
            .collect();
        if finished.is_empty() && claim.is_none() {
            return Ok(Vec::new());
        }
        let (recorded, claimed) = self
            .store
            .deliveries_finish_then_claim(&finished, claim)
            .await?;
        for ((delivery, result), recorded) in sent.drain(..).zip(recorded) {
            let key = &delivery.event.dedup_key;
            let counter = match &result {
                _ if !recorded => &self.stats.lease_lost,
                DeliveryResult::Unsent => continue,
                DeliveryResult::Delivered { .. } => &self.stats.delivered,
                DeliveryResult::Retry { error, .. } => {
                    tracing::warn!(sink, event = %key, "delivery failed, retrying: {error}");
                    &self.stats.retried
                }
                DeliveryResult::Dead { error, .. } => {
                    tracing::error!(sink, event = %key, "dead letter: {error}");
                    &self.stats.dead
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(claimed)
    }

    /// Pending deliveries of sink `index` (due or waiting for a retry).
    async fn pending(&self, index: usize) -> Result<i64, StoreError> {
        let name = &self.sinks[index].config.name;
        Ok(self
            .store
            .deliveries_pending_by_sink()
            .await?
            .into_iter()
            .find(|(sink, _)| sink == name)
            .map_or(0, |(_, n)| n))
    }

    /// Routes and delivers until `stop` turns true or, with `until_idle`,
    /// until every event committed when it started is routed and no
    /// delivery to this relay's sinks is pending. Warns once about pending
    /// deliveries to sinks the file no longer has: they wait for a relay
    /// that has them.
    pub async fn run(
        self: Arc<Self>,
        until_idle: bool,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Arc<RelayStats>, StoreError> {
        let names: Vec<&str> = self.sinks.iter().map(|s| s.config.name.as_str()).collect();
        for (sink, n) in self.store.deliveries_pending_by_sink().await? {
            if !names.contains(&sink.as_str()) {
                tracing::warn!(
                    sink,
                    pending = n,
                    "pending deliveries to a sink this relay's file does not have; they stay pending (see `ratchet outbox`)"
                );
            }
        }
        for sink in &self.sinks {
            // Connecting (and creating the stream) now says early what is
            // wrong; a sink that cannot yet is tried again at each send.
            if let Transport::Nats(nats) = &sink.transport
                && let Err(e) = nats.connect().await
            {
                tracing::warn!(sink = %sink.config.name, "{e}; its deliveries are retried");
            }
        }
        if until_idle {
            self.route().await?;
        }
        let routed = Arc::new(Notify::new());
        let mut loops = tokio::task::JoinSet::new();
        for index in 0..self.sinks.len() {
            let (relay, stop, routed) = (self.clone(), stop.clone(), routed.clone());
            loops.spawn(async move { relay.sink_loop(index, until_idle, stop, &routed).await });
        }
        while !until_idle && !*stop.borrow() {
            match self.route().await {
                Ok(0) => {}
                Ok(_) => {
                    routed.notify_waiters();
                    continue;
                }
                Err(e) => tracing::warn!("routing events failed, trying again: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.route_poll) => {}
                _ = stop.changed() => {}
            }
        }
        while let Some(done) = loops.join_next().await {
            if let Ok(result) = done {
                result?;
            }
        }
        Ok(self.stats.clone())
    }

    async fn sink_loop(
        &self,
        index: usize,
        until_idle: bool,
        mut stop: watch::Receiver<bool>,
        routed: &Notify,
    ) -> Result<(), StoreError> {
        let mut sent = Vec::new();
        while !*stop.borrow() {
            let woken = routed.notified();
            match self.deliver_round(index, &mut sent).await {
                Ok(0) => {}
                Ok(_) => continue,
                // Alone, a relay says why it stopped; beside a worker it
                // carries on, as the worker does, once the database is back.
                Err(e) if until_idle => return Err(e),
                Err(e) => {
                    let sink = &self.sinks[index].config.name;
                    tracing::warn!(sink, "delivering failed, trying again: {e}");
                }
            }
            if until_idle && self.pending(index).await? == 0 {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.poll) => {}
                _ = woken => {}
                _ = stop.changed() => {}
            }
        }
        let sink = &self.sinks[index].config.name;
        self.record(sink, &mut sent, None).await.map(|_| ())
    }
}
