//! The relay: every committed event delivered to the sinks that take it,
//! at least once, in commit order per run and sink (docs/relay.md).
//!
//! A router marks each new outbox event routed and gives it one delivery
//! per sink that takes it, in one transaction. Each sink then has a loop
//! of its own: it claims due deliveries with a lease, a run at a time (the
//! run's earliest pending one and the next few after it), sends each run's
//! one after another on a lane of its own and the runs side by side (a
//! signed webhook POST, or a JetStream publish and its acknowledgement),
//! and records the finished lanes' results with the next claim in one
//! transaction, each under its lease, while the other lanes send. A slow or
//! dead sink only ever holds up itself.

mod envelope;
mod nats;
mod send;
mod sinks;
mod webhook;

use std::collections::{BTreeMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt, stream::FuturesUnordered};
use tokio::sync::{Notify, watch};

use crate::clock::Clock;
use crate::store::{
    ClaimedDelivery, Deliveries, DeliveryClaim, DeliveryFinish, DeliveryResult, Routing, SinkRoute,
    StoreError,
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
    /// Runs a sink sends side by side, each on a lane of its own (the
    /// deliveries it has in flight); as many more wait, claimed, for a lane.
    pub claim_runs: usize,
    /// Deliveries of one run a claim takes, sent one after another: a
    /// span's lease, its lane's bookkeeping and its share of a transaction
    /// are paid once for all of them (ADR 0041).
    pub claim_per_run: usize,
    /// Events routed per transaction; by default the store's
    /// ([`Deliveries::route_page`]).
    pub route_page: Option<usize>,
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
            claim_per_run: 64,
            route_page: None,
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

/// A claimed delivery and how its attempt ended.
type Outcome = (ClaimedDelivery, DeliveryResult);

/// A sink's runs being sent, each on a lane of its own: futures its loop
/// polls, not tasks (ADR 0042). The acknowledgements the connection reads
/// at once wake the loop once, and the lanes they free publish together,
/// so the client writes their publishes to the server in one batch. Each
/// lane catches its own panic: its leases lapse and its deliveries are
/// sent again, and the loop and the other lanes go on.
type Lanes<'a> =
    FuturesUnordered<Pin<Box<dyn Future<Output = std::thread::Result<Vec<Outcome>>> + Send + 'a>>>;

/// A claimed run waiting for a lane: its deliveries in commit order, and
/// when their lease ends.
type Queued = (Vec<ClaimedDelivery>, i64);

/// What a sink's transaction of books did: the outcomes it could not
/// record (all of them, on an error), and what it claimed with the lease's
/// end.
struct Booked {
    unrecorded: Vec<Outcome>,
    claimed: Result<(Vec<ClaimedDelivery>, i64), StoreError>,
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
    sinks: Vec<Sink>,
    /// What routing gives each sink.
    routes: Vec<SinkRoute>,
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
            built.push(Sink {
                config: sink.clone(),
                transport,
            });
        }
        Ok(Self {
            store,
            sinks: built,
            routes: sinks.routes(),
            clock,
            config,
            stats: Arc::default(),
        })
    }

    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Events routed per transaction.
    fn page(&self) -> usize {
        self.config
            .route_page
            .unwrap_or_else(|| self.store.route_page())
    }

    /// Routes the next page of events not yet routed; returns how many.
    async fn route_page(&self) -> Result<usize, StoreError> {
        let routing = Routing {
            page: self.page(),
            sinks: self.routes.clone(),
            now: self.clock.now_ms(),
        };
        let routed = self.store.deliveries_route(&routing).await?;
        self.stats
            .routed
            .fetch_add(routed as u64, Ordering::Relaxed);
        Ok(routed)
    }

    /// Records `batch` and claims up to `runs` runs' due deliveries for sink
    /// `index`, in one transaction. Hands `batch` back unrecorded on an
    /// error, to be recorded again.
    async fn book(&self, index: usize, mut batch: Vec<Outcome>, runs: usize) -> Booked {
        let sink = &self.sinks[index];
        let claim = (runs > 0).then(|| DeliveryClaim {
            relay: self.config.relay_id.clone(),
            sinks: vec![sink.config.name.clone()],
            now: self.clock.now_ms(),
            lease_ms: self.config.lease_ms,
            runs,
            per_run: self.config.claim_per_run,
        });
        let claimed = self
            .record(&sink.config.name, &mut batch, claim.as_ref())
            .await;
        let lease_end = claim.map_or(0, |c| c.now + c.lease_ms);
        Booked {
            unrecorded: batch,
            claimed: claimed.map(|c| (c, lease_end)),
        }
    }

    /// Starts the queued runs of sink `index` on lanes of their own, each
    /// run's deliveries in order, up to `claim_runs` runs side by side.
    fn start_lanes<'a>(
        &'a self,
        index: usize,
        queued: &mut VecDeque<Queued>,
        lanes: &mut Lanes<'a>,
    ) {
        while lanes.len() < self.config.claim_runs
            && let Some((run, lease_end)) = queued.pop_front()
        {
            let sink = &self.sinks[index];
            let send = send::send_run(sink, run, lease_end, self.clock.as_ref(), &self.stats);
            lanes.push(Box::pin(AssertUnwindSafe(send).catch_unwind()));
        }
    }

    /// Records `sent` (emptying it) and, with `claim`, claims the next
    /// deliveries, in one transaction.
    async fn record(
        &self,
        sink: &str,
        sent: &mut Vec<Outcome>,
        claim: Option<&DeliveryClaim>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let now = self.clock.now_ms();
        let finished: Vec<DeliveryFinish> = sent
            .iter()
            .map(|(delivery, result)| DeliveryFinish {
                id: delivery.id,
                relay: self.config.relay_id.clone(),
                lease: delivery.lease,
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
    /// delivery to this relay's sinks is pending. First makes claimable
    /// any pending delivery no claim could find (`deliveries_reconcile`).
    /// Warns once about pending deliveries to sinks the file no longer has:
    /// they wait for a relay that has them.
    pub async fn run(
        self: Arc<Self>,
        until_idle: bool,
        mut stop: watch::Receiver<bool>,
    ) -> Result<Arc<RelayStats>, StoreError> {
        let woken = self.store.deliveries_reconcile().await?;
        if woken > 0 {
            tracing::warn!(
                lanes = woken,
                "runs with pending deliveries no claim could find were made claimable (routed outside a relay's steps)"
            );
        }
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
        let router = Arc::new(Router::default());
        let mut loops = tokio::task::JoinSet::new();
        for index in 0..self.sinks.len() {
            let (relay, stop, router) = (self.clone(), stop.clone(), router.clone());
            loops.spawn(async move { relay.sink_loop(index, until_idle, stop, &router).await });
        }
        // The sinks deliver what is routed while the rest is routed.
        let mut failed = None;
        while !*stop.borrow() {
            match self.route_page().await {
                Ok(n) => {
                    if n > 0 {
                        router.new_events.notify_waiters();
                    }
                    if n == self.page() {
                        continue;
                    }
                    router.caught_up.store(true, Ordering::Release);
                    if until_idle {
                        break;
                    }
                }
                // Alone, a relay delivers what it routed and says why it
                // stopped; beside a worker it carries on, as the worker
                // does, once the database is back.
                Err(e) if until_idle => {
                    failed = Some(e);
                    router.caught_up.store(true, Ordering::Release);
                    break;
                }
                Err(e) => tracing::warn!("routing events failed, trying again: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.route_poll) => {}
                _ = stop.changed() => {}
            }
        }
        router.new_events.notify_waiters();
        while let Some(done) = loops.join_next().await {
            if let Ok(result) = done {
                result?;
            }
        }
        failed.map_or(Ok(self.stats.clone()), Err)
    }

    /// Sink `index`'s loop. Its claimed runs are sent on lanes, up to
    /// `claim_runs` side by side, and as many again wait, claimed, for a
    /// lane; one transaction at a time records what the finished lanes sent
    /// and claims runs for the queue. A lane that finishes starts the next
    /// queued run at once: sending never waits for the books.
    async fn sink_loop(
        &self,
        index: usize,
        until_idle: bool,
        mut stop: watch::Receiver<bool>,
        router: &Router,
    ) -> Result<(), StoreError> {
        let mut lanes = Lanes::new();
        let mut queued: VecDeque<Queued> = VecDeque::new();
        let mut sent: Vec<Outcome> = Vec::new();
        let mut books: Option<Pin<Box<dyn Future<Output = Booked> + Send + '_>>> = None;
        let mut woken = Box::pin(router.new_events.notified());
        // The last claim found nothing due; the last transaction failed.
        let (mut nothing_due, mut failed) = (false, false);
        loop {
            let stopped = *stop.borrow();
            if stopped {
                let unsent = queued.drain(..).flat_map(|(run, _)| run);
                sent.extend(unsent.map(|d| (d, DeliveryResult::Unsent)));
            }
            let room = (2 * self.config.claim_runs).saturating_sub(lanes.len() + queued.len());
            if books.is_none()
                && !stopped
                && !failed
                && (!sent.is_empty() || room > 0 && !nothing_due)
            {
                woken = Box::pin(router.new_events.notified());
                nothing_due = false;
                books = Some(Box::pin(self.book(index, std::mem::take(&mut sent), room)));
            }
            if books.is_none() && lanes.is_empty() && queued.is_empty() {
                if stopped {
                    break;
                }
                if until_idle
                    && !failed
                    && router.caught_up.load(Ordering::Acquire)
                    && self.pending(index).await? == 0
                {
                    break;
                }
            }
            let resting = books.is_none() && (nothing_due || failed);
            tokio::select! {
                Some(done) = lanes.next() => {
                    // A lane that panicked: its leases lapse and its
                    // deliveries are retried.
                    if let Ok(outcomes) = done {
                        sent.extend(outcomes);
                    }
                    self.start_lanes(index, &mut queued, &mut lanes);
                }
                booked = async { books.as_mut().expect("guarded").await }, if books.is_some() => {
                    books = None;
                    sent.extend(booked.unrecorded);
                    match booked.claimed {
                        Ok((claimed, lease_end)) => {
                            nothing_due = claimed.is_empty();
                            queued.extend(by_run(claimed).map(|run| (run, lease_end)));
                            if !*stop.borrow() {
                                self.start_lanes(index, &mut queued, &mut lanes);
                            }
                        }
                        Err(e) if until_idle => return Err(e),
                        Err(e) => {
                            let sink = &self.sinks[index].config.name;
                            tracing::warn!(sink, "delivering failed, trying again: {e}");
                            failed = true;
                        }
                    }
                }
                _ = tokio::time::sleep(self.config.poll), if resting => {
                    (nothing_due, failed) = (false, false);
                }
                _ = &mut woken, if resting && !failed => nothing_due = false,
                _ = stop.changed(), if !stopped => {}
            }
        }
        let sink = &self.sinks[index].config.name;
        self.record(sink, &mut sent, None).await.map(|_| ())
    }
}

/// Claimed deliveries by run, each run's in commit order.
fn by_run(claimed: Vec<ClaimedDelivery>) -> impl Iterator<Item = Vec<ClaimedDelivery>> {
    let mut runs: BTreeMap<String, Vec<ClaimedDelivery>> = BTreeMap::new();
    for delivery in claimed {
        runs.entry(delivery.event.run_id.clone())
            .or_default()
            .push(delivery);
    }
    runs.into_values()
}

/// What the router tells the sinks' loops.
#[derive(Default)]
struct Router {
    /// Events were routed (or routing caught up).
    new_events: Notify,
    /// Every event committed before the relay started is routed.
    caught_up: AtomicBool,
}
