//! `ratchet serve`: the client's operations over HTTP (axum), with an
//! OpenAPI document generated from the handlers (utoipa), errors as
//! problem documents (`problem.rs`), a bearer token on everything but
//! `/health` and the dashboard's page (`dashboard.rs`), and a run's
//! changes as Server-Sent Events (`events.rs`). Runs' endpoints are in
//! `runs.rs`. See docs/http-api.md and docs/dashboard.md.

mod dashboard;
mod events;
pub mod metrics;
mod problem;
mod runs;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Json;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use ratchet_runtime::client::Client;
use ratchet_runtime::store::{DeliveryFilter, DeliveryRow, DeliveryState, PluginSummary, RunQuery};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use crate::BadInput;
use problem::PROBLEM_JSON;
pub use problem::Problem;

/// What every handler reads.
pub struct Api {
    client: Client,
    exporter: ratchet_runtime::metrics::Exporter,
    /// SHA-256 of the bearer token, if one is required.
    token: Option<[u8; 32]>,
    openapi: String,
}

type Shared = State<Arc<Api>>;

/// The largest component `POST /plugins` reads (other bodies: axum's 2 MB).
const MAX_COMPONENT: usize = 256 << 20;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Ratchet",
        description = "Durable pipelines of sandboxed Wasm stages: submit runs, follow them, read what they made, and act on them as an operator."
    ),
    // The data of the event stream's `run` and `stage` events.
    components(schemas(ratchet_runtime::client::RunChange)),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "runs", description = "Runs, their stages, attempts and artifacts"),
        (name = "operator", description = "Cancel, retry, approve and reject"),
        (name = "catalog", description = "Plugins and outbox deliveries"),
        (name = "service", description = "Health, metrics and this document"),
    )
)]
struct Doc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme =
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build());
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", scheme);
    }
}

/// The API's router: every endpoint, the token check, and problem
/// documents for unknown paths and methods.
pub fn router(client: Client, token: Option<&str>) -> Result<axum::Router> {
    let exporter = ratchet_runtime::metrics::Exporter::install()?;
    let (guarded, mut doc) = OpenApiRouter::with_openapi(Doc::openapi())
        .routes(routes!(runs::submit, runs::list))
        .routes(routes!(runs::get))
        .routes(routes!(runs::graph))
        .routes(routes!(runs::attempts))
        .routes(routes!(runs::artifacts))
        .routes(routes!(runs::artifact))
        .routes(routes!(runs::model_calls))
        .routes(routes!(runs::history))
        .routes(routes!(events::stream))
        .routes(routes!(runs::cancel))
        .routes(routes!(runs::retry))
        .routes(routes!(runs::approve))
        .routes(routes!(runs::reject))
        .routes(routes!(plugins, register).layer(DefaultBodyLimit::max(MAX_COMPONENT)))
        .routes(routes!(deliveries))
        .routes(routes!(openapi))
        .routes(routes!(metrics::scrape))
        .split_for_parts();
    let (open, open_doc) = OpenApiRouter::new()
        .routes(routes!(health))
        .split_for_parts();
    guard_in_document(&mut doc);
    doc.merge(open_doc);
    // `/health` needs no token.
    if let Some(op) = doc
        .paths
        .paths
        .get_mut("/health")
        .and_then(|item| item.get.as_mut())
    {
        op.security = Some(Vec::new());
    }
    let api = Arc::new(Api {
        client,
        exporter,
        token: token.map(|t| Sha256::digest(t.as_bytes()).into()),
        openapi: doc.to_json().context("rendering the OpenAPI document")?,
    });
    let guarded = guarded.layer(middleware::from_fn_with_state(api.clone(), authorize));
    let open = open.route("/ui/{asset}", axum::routing::get(dashboard::asset));
    let app = guarded
        .merge(open)
        .fallback(|| async {
            Problem::new(
                StatusCode::NOT_FOUND,
                "no such endpoint; GET /openapi.json lists them",
            )
        })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "this endpoint does not take that method; GET /openapi.json lists what it takes",
            )
        })
        .with_state(api)
        .layer(middleware::from_fn(dashboard::negotiate));
    Ok(app)
}

/// Adds the token check's refusal (401) to every operation of `doc`.
fn guard_in_document(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let problem = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem")));
    let refused = ResponseBuilder::new()
        .description("No bearer token, or not this server's")
        .content(PROBLEM_JSON, problem.build())
        .build();
    for item in doc.paths.paths.values_mut() {
        for op in [&mut item.get, &mut item.post].into_iter().flatten() {
            let responses = &mut op.responses.responses;
            responses.insert("401".into(), RefOr::T(refused.clone()));
        }
    }
}

/// The API token (`RATCHET_API_TOKEN`), refusing an address other than
/// loopback without one.
pub fn token(listen: SocketAddr) -> Result<Option<String>> {
    let token = std::env::var("RATCHET_API_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty());
    if token.is_none() && !listen.ip().is_loopback() {
        return Err(BadInput(format!(
            "`ratchet serve --listen {listen}` would answer anyone who can reach it: set RATCHET_API_TOKEN to a secret, or listen on 127.0.0.1"
        ))
        .into());
    }
    Ok(token)
}

/// `ratchet serve`: serves until SIGTERM or Ctrl-C.
pub async fn run(client: Client, listen: SocketAddr, token: Option<String>) -> Result<ExitCode> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| BadInput(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener.local_addr().context("the listening address")?;
    let stop = crate::signal::shutdown_signal()?;
    println!("listening on http://{addr}");
    tracing::info!(%addr, token = token.is_some(), "serving the HTTP API");
    axum::serve(listener, router(client, token.as_deref())?)
        .with_graceful_shutdown(stop)
        .await
        .context("the HTTP server failed")?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses a request without the bearer token (401, `WWW-Authenticate:
/// Bearer`). Tokens are compared by their SHA-256, so the time taken
/// says nothing about how much of a guess was right.
async fn authorize(State(api): Shared, request: Request, next: Next) -> Response {
    let Some(expected) = &api.token else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let detail = match given {
        Some(t) if <[u8; 32]>::from(Sha256::digest(t.trim().as_bytes())) == *expected => {
            return next.run(request).await;
        }
        Some(_) => "the bearer token is not this server's",
        None => {
            "send the API token as `Authorization: Bearer TOKEN` (the server's RATCHET_API_TOKEN)"
        }
    };
    let mut response = Problem::new(StatusCode::UNAUTHORIZED, detail).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Health {
    /// `ok` when the database answered.
    status: String,
}

/// Whether the server is up and its database answers.
#[utoipa::path(get, path = "/health", tag = "service",
    responses(
        (status = 200, description = "Serving", body = Health),
        (status = 503, description = "The database does not answer", body = Problem, content_type = PROBLEM_JSON),
    ))]
async fn health(State(api): Shared) -> Result<Json<Health>, Problem> {
    let probe = RunQuery {
        limit: 1,
        ..RunQuery::default()
    };
    api.client.runs(&probe).await.map_err(|e| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the database does not answer: {e}"),
        )
    })?;
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "service",
    responses(
        (status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object),
    ))]
async fn openapi(State(api): Shared) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        api.openapi.clone(),
    )
        .into_response()
}

/// Registered plugin versions.
#[utoipa::path(get, path = "/plugins", tag = "catalog",
    responses(
        (status = 200, description = "Every registered version", body = Vec<PluginSummary>),
    ))]
async fn plugins(State(api): Shared) -> Result<Json<Vec<PluginSummary>>, Problem> {
    Ok(Json(api.client.plugins().await?))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct RegisteredPlugin {
    name: String,
    version: String,
    digest: String,
    /// `false`: these bytes were registered before; nothing changed.
    registered: bool,
}

/// Registers a component (the body: its bytes, as `application/wasm` or
/// `application/octet-stream`) under the name and version its manifest
/// declares.
#[utoipa::path(post, path = "/plugins", tag = "catalog",
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "A Wasm component built for Ratchet's `stage` world"),
    responses(
        (status = 201, description = "Registered", body = RegisteredPlugin),
        (status = 200, description = "These bytes were registered before", body = RegisteredPlugin),
        (status = 409, description = "This name and version are registered with other bytes", body = Problem, content_type = PROBLEM_JSON),
        (status = 413, description = "The body is larger than a component may be (256 MiB)", body = Problem, content_type = PROBLEM_JSON),
        (status = 422, description = "Not a component of the `stage` world, or its manifest is invalid", body = Problem, content_type = PROBLEM_JSON),
    ))]
async fn register(
    State(api): Shared,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<RegisteredPlugin>), Problem> {
    let body = body.map_err(|r| Problem::new(r.status(), r.body_text()))?;
    let r = api.client.register(body.to_vec()).await?;
    let inserted = r.outcome == ratchet_runtime::store::PluginPutOutcome::Inserted;
    let status = if inserted {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let body = RegisteredPlugin {
        name: r.manifest.name,
        version: r.manifest.version.to_string(),
        digest: r.digest,
        registered: inserted,
    };
    Ok((status, Json(body)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct DeliveriesQuery {
    /// Only this run's deliveries.
    run: Option<String>,
    /// Only deliveries in this state.
    state: Option<DeliveryState>,
}

/// The outbox's deliveries to sinks, oldest first.
#[utoipa::path(get, path = "/deliveries", tag = "catalog",
    params(DeliveriesQuery),
    responses(
        (status = 200, description = "Deliveries", body = Vec<DeliveryRow>),
        (status = 400, description = "A parameter is not valid", body = Problem, content_type = PROBLEM_JSON),
    ))]
async fn deliveries(
    State(api): Shared,
    query: Result<Query<DeliveriesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<DeliveryRow>>, Problem> {
    let Query(q) = query?;
    let filter = DeliveryFilter {
        run_id: q.run,
        state: q.state,
    };
    Ok(Json(api.client.deliveries(&filter).await?))
}
