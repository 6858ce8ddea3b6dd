//! Prometheus metrics, every name `ratchet_*` (docs/metrics.md). A worker
//! counts what it does as it goes (attempts and their durations, model
//! calls, commit batches) through the `metrics` facade, which costs an
//! atomic load until a process installs [`Exporter`]. What the store knows
//! (jobs ready and running, the oldest ready job's wait, the outbox's
//! pending and dead deliveries) is read from it when scraped, so `serve`
//! and every worker report the same figures.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::plugin::ExecReport;
use crate::scheduler::AttemptOutcome;
use crate::store::{ClaimedJob, History, Result};

/// Attempts that ended, by `plugin` and `outcome` (`succeeded`,
/// `retrying`, `dead`, `lease_lost`).
pub const ATTEMPTS: &str = "ratchet_attempts_total";
/// How long attempts took, from the start of their execution to their
/// commit, by `plugin` and `outcome`.
pub const ATTEMPT_SECONDS: &str = "ratchet_attempt_duration_seconds";
/// Model calls of attempts that ended, by `source`: `fresh` (asked) or
/// `replayed` (the journaled answer of an earlier attempt).
pub const MODEL_CALLS: &str = "ratchet_model_calls_total";
/// HTTP requests of attempts that ended, by `source`: `fresh` (sent),
/// `replayed` (the journaled response) or `denied` (refused unsent).
pub const HTTP_CALLS: &str = "ratchet_http_calls_total";
/// Tokens of the fresh model calls of attempts that ended, by `kind`
/// (`prompt`, `completion`), as their backends counted them.
pub const MODEL_TOKENS: &str = "ratchet_model_tokens_total";
/// Jobs claimed from an attempt whose lease had expired (its worker died
/// or stalled): each is an attempt the store recorded as `lease_expired`.
pub const TAKEOVERS: &str = "ratchet_lease_takeovers_total";
/// Completions per group commit.
pub const COMMIT_BATCH: &str = "ratchet_commit_batch_size";
/// Jobs by `state` (`ready`: due now; `running`), read when scraped.
pub const JOBS: &str = "ratchet_jobs";
/// How long the longest-waiting due job has waited, read when scraped.
pub const READY_AGE: &str = "ratchet_ready_oldest_age_seconds";
/// Outbox deliveries by `state` (`pending`, `dead`), read when scraped.
pub const DELIVERIES: &str = "ratchet_outbox_deliveries";

/// Whether this process installed the recorder: until it does, nothing is
/// built for it (no label is allocated on the attempt's path).
static RECORDING: AtomicBool = AtomicBool::new(false);

/// Records one attempt that ended.
pub(crate) fn attempt(plugin: &str, outcome: &AttemptOutcome, took: Duration, r: &ExecReport) {
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    let outcome = match outcome {
        AttemptOutcome::Succeeded { .. } => "succeeded",
        AttemptOutcome::Retrying { .. } => "retrying",
        AttemptOutcome::Dead { .. } => "dead",
        AttemptOutcome::LeaseLost => "lease_lost",
    };
    let plugin = if plugin.is_empty() { "unknown" } else { plugin };
    let plugin = plugin.to_string();
    metrics::counter!(ATTEMPTS, "plugin" => plugin.clone(), "outcome" => outcome).increment(1);
    metrics::histogram!(ATTEMPT_SECONDS, "plugin" => plugin, "outcome" => outcome)
        .record(took.as_secs_f64());
    let tokens = r.model_tokens;
    for (name, label, value, n) in [
        (MODEL_CALLS, "source", "fresh", r.model_calls_fresh),
        (MODEL_CALLS, "source", "replayed", r.model_calls_replayed),
        (HTTP_CALLS, "source", "fresh", r.http_calls_fresh),
        (HTTP_CALLS, "source", "replayed", r.http_calls_replayed),
        (HTTP_CALLS, "source", "denied", r.http_requests_denied),
        (MODEL_TOKENS, "kind", "prompt", tokens.prompt_tokens),
        (MODEL_TOKENS, "kind", "completion", tokens.completion_tokens),
    ] {
        if n > 0 {
            metrics::counter!(name, label => value).increment(u64::from(n));
        }
    }
}

/// Records the lease takeovers among jobs just claimed.
pub(crate) fn claimed(jobs: &[ClaimedJob]) {
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    let taken_over = jobs.iter().filter(|j| j.taken_over).count();
    if taken_over > 0 {
        metrics::counter!(TAKEOVERS).increment(taken_over as u64);
    }
}

/// Records one group commit of `size` completions.
pub(crate) fn commit_batch(size: usize) {
    if RECORDING.load(Ordering::Relaxed) {
        metrics::histogram!(COMMIT_BATCH).record(size as f64);
    }
}

/// The process's Prometheus recorder, and its text format.
#[derive(Clone)]
pub struct Exporter {
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

/// Why metrics cannot be recorded.
#[derive(Debug, thiserror::Error)]
#[error("cannot record metrics: {0}")]
pub struct MetricsError(String);

impl Exporter {
    /// Installs the recorder for this process (the first call does; later
    /// calls share it).
    pub fn install() -> Result<Self, MetricsError> {
        static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
        if let Some(handle) = HANDLE.get() {
            return Ok(Self {
                handle: handle.clone(),
            });
        }
        let seconds = [
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
        ];
        let sizes = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
        let bad = |e: metrics_exporter_prometheus::BuildError| MetricsError(e.to_string());
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(ATTEMPT_SECONDS.into()), &seconds)
            .map_err(bad)?
            .set_buckets_for_metric(Matcher::Full(COMMIT_BATCH.into()), &sizes)
            .map_err(bad)?
            .install_recorder()
            .map_err(bad)?;
        let handle = HANDLE.get_or_init(|| handle).clone();
        describe();
        RECORDING.store(true, Ordering::Relaxed);
        Ok(Self { handle })
    }

    /// The metrics in Prometheus' text format, with the store's figures
    /// read now.
    pub async fn render(&self, store: &(impl History + ?Sized), now: i64) -> Result<String> {
        let g = store.queue_gauges(now).await?;
        metrics::gauge!(JOBS, "state" => "ready").set(g.ready as f64);
        metrics::gauge!(JOBS, "state" => "running").set(g.running as f64);
        let age = g.oldest_ready_at.map_or(0, |due| (now - due).max(0));
        metrics::gauge!(READY_AGE).set(age as f64 / 1000.0);
        metrics::gauge!(DELIVERIES, "state" => "pending").set(g.deliveries_pending as f64);
        metrics::gauge!(DELIVERIES, "state" => "dead").set(g.deliveries_dead as f64);
        self.handle.run_upkeep();
        Ok(self.handle.render())
    }
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(ATTEMPTS, "Attempts that ended, by plugin and outcome");
    describe_histogram!(
        ATTEMPT_SECONDS,
        Unit::Seconds,
        "Attempt durations, execution to commit"
    );
    describe_counter!(
        MODEL_CALLS,
        "Model calls of ended attempts, fresh or replayed"
    );
    describe_counter!(
        HTTP_CALLS,
        "HTTP requests of ended attempts, fresh, replayed or denied"
    );
    describe_counter!(
        MODEL_TOKENS,
        "Tokens of fresh model calls of ended attempts, prompt or completion"
    );
    describe_counter!(TAKEOVERS, "Jobs claimed from attempts whose lease expired");
    describe_histogram!(COMMIT_BATCH, Unit::Count, "Completions per group commit");
    describe_gauge!(
        JOBS,
        "Jobs due now (ready) and running, read from the store"
    );
    describe_gauge!(
        READY_AGE,
        Unit::Seconds,
        "How long the longest-waiting due job has waited"
    );
    describe_gauge!(
        DELIVERIES,
        "Outbox deliveries pending and dead, read from the store"
    );
}
