//! Runs over HTTP: submit (idempotent with `Idempotency-Key`), list a
//! page at a time, read a run, its attempts, artifacts and model journal,
//! and an operator's cancel, retry, approve and reject.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use ratchet_runtime::client::{RunDetail, RunPage, Submitted};
use ratchet_runtime::manifest::Pipeline;
use ratchet_runtime::store::{
    ArtifactMeta, AttemptRow, Decision, ModelCall, Retried, RunEvent, RunGraph, RunQuery, RunState,
    Verdict,
};
use serde::{Deserialize, Serialize};

use super::Shared;
use super::problem::{BodyRefused, PROBLEM_JSON, Problem};

/// The longest `Idempotency-Key` taken.
const MAX_KEY: usize = 255;

/// A run to submit.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The pipeline, as the TOML text `ratchet run` reads from a file.
    #[schema(example = "name = \"one\"\n[[stage]]\nname = \"a\"\nplugin = \"noop@^1\"\n")]
    pipeline: String,
    /// The run's input as text (UTF-8).
    input: Option<String>,
    /// The run's input as base64, for bytes that are not text.
    input_base64: Option<String>,
}

/// Submits a run. With an `Idempotency-Key`, a second request with the
/// same key creates nothing and answers with the first run (200).
#[utoipa::path(post, path = "/runs", tag = "runs",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes the submit idempotent: one run per key (at most 255 visible ASCII characters)")),
    request_body = SubmitRequest,
    responses(
        (status = 201, description = "The run was created", body = Submitted,
            headers(("Location" = String, description = "The run's URL"))),
        (status = 200, description = "The key named a run submitted before; nothing was written", body = Submitted,
            headers(("Location" = String, description = "The run's URL"))),
        (status = 400, description = "The key or the body cannot be read", body = Problem, content_type = PROBLEM_JSON),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = PROBLEM_JSON),
        (status = 422, description = "The pipeline is invalid or cannot be planned against the registry, or the key was used for another pipeline", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn submit(
    api: Shared,
    headers: HeaderMap,
    body: Result<Json<SubmitRequest>, JsonRejection>,
) -> Result<Response, Problem> {
    let key = idempotency_key(&headers)?;
    let Json(body) = body?;
    let pipeline = Pipeline::parse("the request's pipeline", &body.pipeline)
        .map_err(|e| Problem::unprocessable(e.to_string()))?;
    let input = match (body.input, body.input_base64) {
        (Some(_), Some(_)) => {
            return Err(Problem::unprocessable(
                "give the input as `input` (text) or `input_base64`, not both",
            ));
        }
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| Problem::unprocessable(format!("`input_base64` is not base64: {e}")))?,
        (None, None) => Vec::new(),
    };
    let submitted = api.client.submit(&pipeline, input, key.clone()).await?;
    if !submitted.created {
        let earlier = api.client.run(&submitted.run_id).await?;
        if earlier.run.pipeline != pipeline.name() {
            return Err(Problem::unprocessable(format!(
                "Idempotency-Key `{}` was used for run {} of pipeline `{}`; use a new key for a run of `{}`",
                key.unwrap_or_default(),
                submitted.run_id,
                earlier.run.pipeline,
                pipeline.name()
            )));
        }
    }
    let status = if submitted.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let location = HeaderValue::from_str(&format!("/runs/{}", submitted.run_id))
        .map_err(|e| Problem::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((status, [(header::LOCATION, location)], Json(submitted)).into_response())
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().ok().map(str::trim).unwrap_or_default();
    let visible = key.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    if key.is_empty() || key.len() > MAX_KEY || !visible {
        return Err(Problem::bad_request(format!(
            "Idempotency-Key must be 1 to {MAX_KEY} visible ASCII characters"
        )));
    }
    Ok(Some(key.to_string()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunsQuery {
    /// Only runs in this state.
    state: Option<RunState>,
    /// Only runs of this pipeline (its `name`).
    pipeline: Option<String>,
    /// Only the run submitted with this `Idempotency-Key`.
    key: Option<String>,
    /// Most runs in the page (1 to 1000; 50 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// The `next_cursor` of the page before.
    cursor: Option<String>,
}

/// Runs, newest first, a page at a time: follow `next_cursor` until it is
/// `null`.
#[utoipa::path(get, path = "/runs", tag = "runs",
    params(RunsQuery),
    responses(
        (status = 200, description = "A page of runs", body = RunPage),
        (status = 400, description = "A parameter is not valid", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn list(
    api: Shared,
    query: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Json<RunPage>, Problem> {
    let Query(q) = query?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(Problem::bad_request(format!(
            "`limit={limit}` is out of range: ask for 1 to 1000 runs"
        )));
    }
    let query = RunQuery {
        state: q.state,
        pipeline: q.pipeline,
        before: q.cursor,
        key: q.key,
        limit,
    };
    Ok(Json(api.client.runs(&query).await?))
}

/// A run's graph: its happens-before edges (`data` for an input read,
/// `after` for ordering only), each with whether it is satisfied, and
/// where each stage's inputs are read from.
#[utoipa::path(get, path = "/runs/{run}/graph", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run's edges and input bindings", body = RunGraph),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn graph(api: Shared, Path(run): Path<String>) -> Result<Json<RunGraph>, Problem> {
    Ok(Json(api.client.graph(&run).await?))
}

/// A run with its stages.
#[utoipa::path(get, path = "/runs/{run}", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run", body = RunDetail),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn get(api: Shared, Path(run): Path<String>) -> Result<Json<RunDetail>, Problem> {
    Ok(Json(api.client.run(&run).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AttemptsQuery {
    /// Only this stage's attempts.
    stage: Option<String>,
}

/// Every attempt of a run (or of one stage), oldest first: who ran it,
/// when, how it ended, and whether its proposal became canonical.
#[utoipa::path(get, path = "/runs/{run}/attempts", tag = "runs",
    params(("run" = String, Path, description = "The run's id"), AttemptsQuery),
    responses(
        (status = 200, description = "The attempts", body = Vec<AttemptRow>),
        (status = 400, description = "A parameter is not valid", body = Problem, content_type = PROBLEM_JSON),
        (status = 404, description = "No such run or stage", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn attempts(
    api: Shared,
    Path(run): Path<String>,
    query: Result<Query<AttemptsQuery>, QueryRejection>,
) -> Result<Json<Vec<AttemptRow>>, Problem> {
    let Query(q) = query?;
    Ok(Json(api.client.attempts(&run, q.stage.as_deref()).await?))
}

/// The run's canonical artifacts (without their bytes).
#[utoipa::path(get, path = "/runs/{run}/artifacts", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The artifacts", body = Vec<ArtifactMeta>),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn artifacts(
    api: Shared,
    Path(run): Path<String>,
) -> Result<Json<Vec<ArtifactMeta>>, Problem> {
    Ok(Json(api.client.artifacts(&run).await?))
}

/// One canonical artifact's bytes, with its media type as `Content-Type`
/// and its digest as the `ETag`.
#[utoipa::path(get, path = "/runs/{run}/artifacts/{stage}/{output}", tag = "runs",
    params(
        ("run" = String, Path, description = "The run's id"),
        ("stage" = String, Path, description = "The stage that made it"),
        ("output" = String, Path, description = "The stage's output"),
    ),
    responses(
        (status = 200, description = "The bytes, in the media type the stage gave them", content_type = "*/*", body = Vec<u8>,
            headers(("ETag" = String, description = "The artifact's digest"))),
        (status = 404, description = "No such run or artifact", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn artifact(
    api: Shared,
    Path((run, stage, output)): Path<(String, String, String)>,
) -> Result<Response, Problem> {
    let artifact = api.client.artifact(&run, &stage, &output).await?;
    let media = HeaderValue::from_str(&artifact.meta.media_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let etag = HeaderValue::from_str(&format!("\"{}\"", artifact.meta.digest))
        .map_err(|e| Problem::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let headers = [(header::CONTENT_TYPE, media), (header::ETAG, etag)];
    Ok((headers, artifact.bytes).into_response())
}

/// The run's journal of model calls: each stage's requests and the
/// answers it continued from (a retry replays them).
#[utoipa::path(get, path = "/runs/{run}/model-calls", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The journal", body = Vec<ModelCall>),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn model_calls(
    api: Shared,
    Path(run): Path<String>,
) -> Result<Json<Vec<ModelCall>>, Problem> {
    Ok(Json(api.client.model_calls(&run).await?))
}

/// The run's history: the operators' changes to it (upgrades, cancels,
/// retries), oldest first.
#[utoipa::path(get, path = "/runs/{run}/history", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The history", body = Vec<RunEvent>),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn history(api: Shared, Path(run): Path<String>) -> Result<Json<Vec<RunEvent>>, Problem> {
    Ok(Json(api.client.history(&run).await?))
}

/// Who an operator's request names, or `api`.
fn acting(by: Option<String>) -> String {
    by.unwrap_or_else(|| "api".into())
}

/// Who acts, and why: recorded with the action.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    reason: Option<String>,
    /// Who cancels (`api` by default).
    by: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Cancelled {
    run_id: String,
    /// Attempts running when it was cancelled, now fenced out.
    in_flight: u64,
    /// Stages that will not start.
    waiting: u64,
}

/// Cancels a running run.
#[utoipa::path(post, path = "/runs/{run}/cancel", tag = "operator",
    params(("run" = String, Path, description = "The run's id")),
    request_body = CancelRequest,
    responses(
        (status = 200, description = "Cancelled", body = Cancelled),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "The run has already finished", body = Problem, content_type = PROBLEM_JSON),
        BodyRefused,
    ))]
pub async fn cancel(
    api: Shared,
    Path(run): Path<String>,
    body: Result<Json<CancelRequest>, JsonRejection>,
) -> Result<Json<Cancelled>, Problem> {
    let Json(body) = body?;
    let by = acting(body.by);
    let (in_flight, waiting) = api.client.cancel(&run, body.reason, by).await?;
    Ok(Json(Cancelled {
        run_id: run,
        in_flight,
        waiting,
    }))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryRequest {
    /// Retry from this stage (and discard only its journal with `fresh`).
    stage: Option<String>,
    /// Ask the model again instead of replaying the journaled answers.
    #[serde(default)]
    fresh: bool,
    /// Who retries (`api` by default).
    by: Option<String>,
}

/// Retries a failed or cancelled run from the stages that did not succeed.
#[utoipa::path(post, path = "/runs/{run}/retry", tag = "operator",
    params(("run" = String, Path, description = "The run's id")),
    request_body = RetryRequest,
    responses(
        (status = 200, description = "Running again", body = Retried),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "The run cannot be retried (still running, succeeded, or a gate rejected it)", body = Problem, content_type = PROBLEM_JSON),
        BodyRefused,
    ))]
pub async fn retry(
    api: Shared,
    Path(run): Path<String>,
    body: Result<Json<RetryRequest>, JsonRejection>,
) -> Result<Json<Retried>, Problem> {
    let Json(body) = body?;
    let by = acting(body.by);
    Ok(Json(
        api.client.retry(&run, body.stage, body.fresh, by).await?,
    ))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    /// Why, for the record.
    note: Option<String>,
    /// Who decides (`api` by default).
    by: Option<String>,
}

async fn decide(
    api: Shared,
    (run, stage): (String, String),
    verdict: Verdict,
    body: Result<Json<DecideRequest>, JsonRejection>,
) -> Result<Json<Decision>, Problem> {
    let Json(body) = body?;
    let by = acting(body.by);
    Ok(Json(
        api.client
            .decide(&run, &stage, verdict, by, body.note)
            .await?,
    ))
}

/// Approves an approval gate: the stages after it run.
#[utoipa::path(post, path = "/runs/{run}/stages/{stage}/approve", tag = "operator",
    params(("run" = String, Path, description = "The run's id"), ("stage" = String, Path, description = "The gate")),
    request_body = DecideRequest,
    responses(
        (status = 200, description = "The decision recorded", body = Decision),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "Not a gate awaiting a decision, or decided already (the detail says by whom)", body = Problem, content_type = PROBLEM_JSON),
        BodyRefused,
    ))]
pub async fn approve(
    api: Shared,
    Path(at): Path<(String, String)>,
    body: Result<Json<DecideRequest>, JsonRejection>,
) -> Result<Json<Decision>, Problem> {
    decide(api, at, Verdict::Approved, body).await
}

/// Rejects an approval gate: the run fails, for good.
#[utoipa::path(post, path = "/runs/{run}/stages/{stage}/reject", tag = "operator",
    params(("run" = String, Path, description = "The run's id"), ("stage" = String, Path, description = "The gate")),
    request_body = DecideRequest,
    responses(
        (status = 200, description = "The decision recorded", body = Decision),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
        (status = 409, description = "Not a gate awaiting a decision, or decided already (the detail says by whom)", body = Problem, content_type = PROBLEM_JSON),
        BodyRefused,
    ))]
pub async fn reject(
    api: Shared,
    Path(at): Path<(String, String)>,
    body: Result<Json<DecideRequest>, JsonRejection>,
) -> Result<Json<Decision>, Problem> {
    decide(api, at, Verdict::Rejected, body).await
}
