//! The relay: every committed event delivered to the sinks that take it,
//! at least once, in commit order per run and sink (docs/relay.md).
//!
//! A router marks each new outbox event routed and gives it one delivery
//! per sink that takes it, in one transaction. Each sink then has a loop
//! of its own: it claims its due deliveries with a lease (the earliest
//! pending one of each run only), sends them, and records each result
//! under the lease. A slow or dead sink only ever holds up itself.

mod sinks;
mod webhook;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::clock::Clock;
use crate::crash;
use crate::store::{
    ClaimedDelivery, Deliveries, DeliveryClaim, DeliveryFinish, DeliveryResult, NewDelivery,
    OutboxRow, Routing, StoreError,
};
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
    /// Deliveries a sink's loop claims and sends at once.
    pub claim_limit: usize,
    /// Events routed per transaction.
    pub route_page: usize,
    /// How long a loop with nothing due waits before it looks again.
    pub poll: Duration,
}

impl RelayConfig {
    pub fn new(relay_id: impl Into<String>) -> Self {
        Self {
            relay_id: relay_id.into(),
            lease_ms: 60_000,
            claim_limit: 64,
            route_page: 512,
            poll: Duration::from_millis(200),
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
    /// Results dropped because another relay had taken the lease over.
    pub lease_lost: AtomicU64,
}

impl RelayStats {
    pub fn summary(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} routed, {} delivered, {} retries, {} dead letters, {} results after a lost lease",
            n(&self.routed),
            n(&self.delivered),
            n(&self.retried),
            n(&self.dead),
            n(&self.lease_lost)
        )
    }
}

/// How one send ended, before the retry policy is applied.
#[derive(Debug)]
pub(crate) enum Sent {
    Delivered(Option<i64>),
    /// Worth another attempt (a timeout, a refused connection, 408, 429, 5xx).
    Retryable {
        status: Option<i64>,
        error: String,
    },
    /// The sink refused the event for good (another 4xx, a redirect).
    Refused {
        status: Option<i64>,
        error: String,
    },
}

impl Sent {
    fn retry(status: Option<i64>, error: String) -> Self {
        Self::Retryable { status, error }
    }
}

#[derive(Debug)]
enum Transport {
    Webhook(webhook::Webhook),
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
                    if timeout.as_millis() as i64 >= config.lease_ms {
                        return Err(fail(format!(
                            "`timeout_ms` ({} ms) is not below the relay's lease ({} ms); lower it",
                            timeout.as_millis(),
                            config.lease_ms
                        )));
                    }
                    Transport::Webhook(webhook::Webhook::new(url, secret, *timeout).map_err(fail)?)
                }
            };
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

    /// One round of sink `index`: claims its due deliveries, sends them
    /// together and records each result. Returns how many it claimed.
    async fn deliver_round(&self, index: usize) -> Result<usize, StoreError> {
        let sink = &self.sinks[index];
        let claimed = self
            .store
            .deliveries_claim(&DeliveryClaim {
                relay: self.config.relay_id.clone(),
                sinks: vec![sink.config.name.clone()],
                now: self.clock.now_ms(),
                lease_ms: self.config.lease_ms,
                limit: self.config.claim_limit,
            })
            .await?;
        let count = claimed.len();
        let mut sends = tokio::task::JoinSet::new();
        for delivery in claimed {
            let (sink, clock) = (sink.clone(), self.clock.clone());
            sends.spawn(async move {
                let result = attempt(&sink, &delivery, clock.as_ref()).await;
                (delivery, result)
            });
        }
        while let Some(sent) = sends.join_next().await {
            let Ok((delivery, result)) = sent else {
                continue; // a send that panicked: its lease lapses and it is retried
            };
            self.finish(&sink.config.name, delivery, result).await?;
        }
        Ok(count)
    }

    async fn finish(
        &self,
        sink: &str,
        delivery: ClaimedDelivery,
        result: DeliveryResult,
    ) -> Result<(), StoreError> {
        let counter = match &result {
            DeliveryResult::Delivered { .. } => &self.stats.delivered,
            DeliveryResult::Retry { error, .. } => {
                tracing::warn!(sink, event = %delivery.event.dedup_key, "delivery failed, retrying: {error}");
                &self.stats.retried
            }
            DeliveryResult::Dead { error, .. } => {
                tracing::error!(sink, event = %delivery.event.dedup_key, "dead letter: {error}");
                &self.stats.dead
            }
        };
        let finished = self
            .store
            .delivery_finish(&DeliveryFinish {
                id: delivery.id,
                relay: self.config.relay_id.clone(),
                attempts: delivery.attempts,
                result,
                now: self.clock.now_ms(),
            })
            .await?;
        let counter = if finished {
            counter
        } else {
            &self.stats.lease_lost
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
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
                _ = tokio::time::sleep(self.config.poll) => {}
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
        while !*stop.borrow() {
            let woken = routed.notified();
            match self.deliver_round(index).await {
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
        Ok(())
    }
}

/// Sends one claimed delivery and applies its sink's retry policy.
async fn attempt(sink: &Sink, d: &ClaimedDelivery, clock: &dyn Clock) -> DeliveryResult {
    crash::point("relay_before_send");
    let body = envelope(&d.event);
    let sent = match &sink.transport {
        Transport::Webhook(hook) => {
            hook.send(&d.event.dedup_key, body, clock.now_ms() / 1_000)
                .await
        }
    };
    crash::point("relay_after_send");
    let now = clock.now_ms();
    match sent {
        Sent::Delivered(status) => DeliveryResult::Delivered { status },
        Sent::Refused { status, error } => DeliveryResult::Dead { status, error },
        Sent::Retryable { status, error } => {
            let config = &sink.config;
            let age = Duration::from_millis(u64::try_from(now - d.retrying_since).unwrap_or(0));
            if d.attempts >= i64::from(config.max_attempts) || age >= config.max_age {
                DeliveryResult::Dead {
                    status,
                    error: format!(
                        "retries exhausted ({} attempts over {} s): {error}",
                        d.attempts,
                        age.as_secs()
                    ),
                }
            } else {
                DeliveryResult::Retry {
                    at: now + config.backoff.delay_ms(d.attempts),
                    status,
                    error,
                }
            }
        }
    }
}

/// `ms` since the epoch as RFC 3339, to the millisecond.
pub fn rfc3339(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// What every sink is sent for an event: its identity, type, time, run and
/// stage around the host-written payload.
pub fn envelope(e: &OutboxRow) -> Vec<u8> {
    let data = serde_json::from_str::<serde_json::Value>(&e.payload)
        .unwrap_or_else(|_| serde_json::Value::String(e.payload.clone()));
    serde_json::json!({
        "id": e.dedup_key,
        "type": e.event,
        "timestamp": rfc3339(e.created_at),
        "run": e.run_id,
        "stage": e.stage,
        "data": data,
    })
    .to_string()
    .into_bytes()
}
