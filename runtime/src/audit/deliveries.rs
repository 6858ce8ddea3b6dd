//! The audit of deliveries: each one of an event in the outbox, made to a
//! sink that takes it.

use super::{AuditReport, CONTINUATION, RUNS_PER_PAGE, Violation};
use crate::relay::Sinks;
use crate::store::{DeliveryFilter, DeliveryState, SinkRoute, Store, StoreError};

/// Adds to `report` each delivery of `run` (or of every run, one run's
/// deliveries in memory at a time) whose event is not in the outbox, each
/// the dead letters' table and the delivery's state disagree on and,
/// given the sinks file, each made to a sink of it that does not take its
/// event. A delivery to a sink the file no longer has is not judged: it
/// waits for a relay whose file has it.
pub async fn audit_deliveries(
    store: &dyn Store,
    sinks: Option<&Sinks>,
    run: Option<&str>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    // No foreign key keeps a delivery's event in the outbox on PostgreSQL
    // (migration 0023), and a run's deliveries are listed through its
    // events: those whose event is gone are read apart, all at once.
    for d in store.deliveries_orphaned(run).await? {
        report.violations.push(Violation {
            invariant: CONTINUATION,
            run_id: d.run_id,
            stage: "-".into(),
            detail: format!(
                "delivery {} to sink `{}` names event {}, which is not in the outbox",
                d.id, d.sink, d.outbox_id
            ),
        });
    }
    // PostgreSQL keeps its dead letters in a table of their own as well
    // (migration 0028): what it lists is what `--state dead` shows and
    // `redeliver --dead` revives.
    for d in store.deliveries_dead_misfiled(run).await? {
        let state = d.state.map_or("gone", DeliveryState::as_str);
        let detail = if d.listed {
            format!(
                "the dead letters (`dead_deliveries`) list delivery {} to sink `{}`, \
                 whose state is {state}",
                d.id, d.sink
            )
        } else {
            format!(
                "delivery {} to sink `{}` is dead but not among the dead letters \
                 (`dead_deliveries`): `ratchet outbox --state dead` and `redeliver --dead` miss it",
                d.id, d.sink
            )
        };
        report.violations.push(Violation {
            invariant: CONTINUATION,
            run_id: d.run_id.unwrap_or_else(|| "-".into()),
            stage: "-".into(),
            detail,
        });
    }
    let routes = sinks.map(Sinks::routes);
    let routes = routes.as_deref();
    if let Some(run) = run {
        return audit_run_deliveries(store, routes, run, report).await;
    }
    let mut after: Option<String> = None;
    loop {
        let ids = store.run_ids(after.as_deref(), RUNS_PER_PAGE).await?;
        for id in &ids {
            audit_run_deliveries(store, routes, id, report).await?;
        }
        if ids.len() < RUNS_PER_PAGE {
            return Ok(());
        }
        after = ids.last().cloned();
    }
}

async fn audit_run_deliveries(
    store: &dyn Store,
    routes: Option<&[SinkRoute]>,
    run: &str,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let filter = DeliveryFilter {
        run_id: Some(run.to_string()),
        state: None,
    };
    for d in store.delivery_list(&filter).await? {
        let Some(route) = routes.and_then(|r| r.iter().find(|s| s.sink == d.sink)) else {
            continue;
        };
        if !route.takes(&d.event) {
            report.violations.push(Violation {
                invariant: CONTINUATION,
                run_id: d.run_id,
                stage: "-".into(),
                detail: format!(
                    "delivery {} sends `{}` to sink `{}`, which does not take it",
                    d.id, d.event, d.sink
                ),
            });
        }
    }
    Ok(())
}
