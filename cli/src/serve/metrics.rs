//! `/metrics` in Prometheus' text format: on `serve` (behind its token)
//! and on `worker --metrics-listen ADDR` (loopback unless told otherwise;
//! no token). Names and labels are in docs/metrics.md.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use ratchet_runtime::clock::Clock;
use ratchet_runtime::metrics::Exporter;
use ratchet_runtime::store::Store;

use super::Shared;
use super::problem::{PROBLEM_JSON, Problem};
use crate::BadInput;

const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

async fn render(exporter: &Exporter, store: &dyn Store, clock: &dyn Clock) -> Response {
    match exporter.render(store, clock.now_ms()).await {
        Ok(text) => ([(header::CONTENT_TYPE, TEXT_FORMAT)], text).into_response(),
        Err(e) => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the database does not answer: {e}"),
        )
        .into_response(),
    }
}

/// The process's metrics, and the store's figures read now.
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses(
        (status = 200, description = "Prometheus' text format (docs/metrics.md)", content_type = "text/plain", body = String),
        (status = 503, description = "The database does not answer", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn scrape(State(api): Shared) -> Response {
    let client = &api.client;
    render(
        &api.exporter,
        client.store().as_ref(),
        client.clock().as_ref(),
    )
    .await
}

/// Serves `GET /metrics` for a worker on `addr` until the process ends;
/// returns the address it listens on.
pub async fn listen(
    addr: SocketAddr,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
) -> Result<SocketAddr> {
    let exporter = Exporter::install()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| BadInput(format!("cannot listen for metrics on {addr}: {e}")))?;
    let bound = listener.local_addr().context("the metrics address")?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(async move || render(&exporter, store.as_ref(), clock.as_ref()).await),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("the metrics endpoint stopped: {e}");
        }
    });
    Ok(bound)
}
