//! `ratchet relay` and `ratchet outbox`: the sinks file, the relay that
//! delivers to it, and the deliveries as an operator sees them.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;

use crate::{BadInput, Env};
use ratchet_runtime::relay::{Relay, RelayConfig, Sinks};
use ratchet_runtime::store::{DeliveryFilter, DeliveryState, Redeliver};

/// Reads and parses the sinks file.
pub(super) fn load_sinks(path: &Path) -> Result<Sinks> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        BadInput(format!(
            "cannot read the sinks file `{}`: {e}",
            path.display()
        ))
    })?;
    Ok(Sinks::parse(&path.display().to_string(), &text)?)
}

/// A relay for the sinks file at `path`, its secrets read from this
/// process's environment.
pub(super) fn relay(env: &Env, path: &Path, config: RelayConfig) -> Result<Arc<Relay>> {
    let sinks = load_sinks(path)?;
    let lookup = |name: &str| std::env::var(name).ok();
    Ok(Arc::new(Relay::new(
        env.store.clone(),
        &sinks,
        &lookup,
        env.clock.clone(),
        config,
    )?))
}

pub(super) fn parse_state(state: Option<&str>) -> Result<Option<DeliveryState>> {
    state
        .map(|s| {
            DeliveryState::parse(s).ok_or_else(|| {
                BadInput(format!(
                    "`--state {s}` is not a delivery state (pending, delivered or dead)"
                ))
                .into()
            })
        })
        .transpose()
}

/// `ratchet outbox [RUN] [--state S] [--json]`.
pub(super) async fn list(
    env: &Env,
    run: Option<String>,
    state: Option<DeliveryState>,
    json: bool,
) -> Result<ExitCode> {
    let rows = env
        .store
        .delivery_list(&DeliveryFilter { run_id: run, state })
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        println!(
            "no deliveries (events are routed to sinks by `ratchet relay` or a worker with --sinks)"
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>6}  {:<10} {:<16} {:>8}  {:<26} event (dedup key); last error",
        "id", "state", "sink", "attempts", "delivered at"
    );
    for d in rows {
        let delivered = d.delivered_at.map_or("-".to_string(), crate::when::local);
        let error = d
            .last_error
            .as_deref()
            .map_or("-".to_string(), |e| ratchet_runtime::text::bounded(e, 120));
        println!(
            "{:>6}  {:<10} {:<16} {:>8}  {:<26} {}; {error}",
            d.id,
            d.state.as_str(),
            d.sink,
            d.attempts,
            delivered,
            d.dedup_key,
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `ratchet outbox redeliver ID | --dead`.
pub(super) async fn redeliver(
    env: &Env,
    id: Option<i64>,
    dead: bool,
    json: bool,
) -> Result<ExitCode> {
    let which = match (id, dead) {
        (Some(id), false) => Redeliver::One(id),
        (None, true) => Redeliver::AllDead,
        _ => {
            return Err(BadInput(
                "name one delivery (`ratchet outbox redeliver ID`) or all dead letters (`--dead`)"
                    .into(),
            )
            .into());
        }
    };
    let n = env
        .store
        .deliveries_redeliver(which, env.clock.now_ms())
        .await?;
    if let (Redeliver::One(id), 0) = (which, n) {
        return Err(BadInput(format!(
            "delivery {id} is not a dead letter (see `ratchet outbox --state dead`)"
        ))
        .into());
    }
    if json {
        return crate::inspect::print_json(&serde_json::json!({ "redelivered": n }));
    }
    println!("{n} dead letter(s) pending again, under their dedup keys");
    Ok(ExitCode::SUCCESS)
}
