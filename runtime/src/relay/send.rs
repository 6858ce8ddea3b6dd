//! A round's sends: each run's claimed deliveries one after another, and
//! each send's result under its sink's retry policy.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{RelayStats, Sent, Sink, Transport, envelope};
use crate::clock::Clock;
use crate::crash;
use crate::store::{ClaimedDelivery, DeliveryResult};

/// Sends a run's claimed deliveries one after another, in commit order.
/// Once one is to be retried, the rest wait behind it, unsent (a dead
/// letter holds nothing back); so does any whose send could outlast the
/// lease, which ends at `lease_end`.
pub(super) async fn send_run(
    sink: &Sink,
    run: Vec<ClaimedDelivery>,
    lease_end: i64,
    clock: &dyn Clock,
    stats: &RelayStats,
) -> Vec<(ClaimedDelivery, DeliveryResult)> {
    let timeout = i64::try_from(sink.config.kind.timeout().as_millis()).unwrap_or(i64::MAX);
    let mut held = false;
    let mut results = Vec::with_capacity(run.len());
    for delivery in run {
        held = held || clock.now_ms().saturating_add(timeout) >= lease_end;
        let result = if held {
            DeliveryResult::Unsent
        } else {
            attempt(sink, &delivery, clock, stats).await
        };
        held = held || matches!(result, DeliveryResult::Retry { .. });
        results.push((delivery, result));
    }
    results
}

/// Sends one claimed delivery and applies its sink's retry policy.
async fn attempt(
    sink: &Sink,
    d: &ClaimedDelivery,
    clock: &dyn Clock,
    stats: &RelayStats,
) -> DeliveryResult {
    crash::point("relay_before_send");
    let body = envelope(&d.event);
    let e = &d.event;
    let sent = match &sink.transport {
        Transport::Webhook(hook) => hook.send(&e.dedup_key, body, clock.now_ms() / 1_000).await,
        Transport::Nats(nats) => nats.send(&e.dedup_key, &e.event, &e.run_id, body).await,
    };
    crash::point("relay_after_send");
    let now = clock.now_ms();
    match sent {
        Sent::Delivered { status, duplicate } => {
            if duplicate {
                stats.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            DeliveryResult::Delivered { status }
        }
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
