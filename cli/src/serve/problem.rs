//! Errors as RFC 9457 problem documents (`application/problem+json`):
//! the status, its reason phrase as the title, and the same one line the
//! command line prints as the detail.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use ratchet_runtime::client::{ClientError, ErrorKind};
use serde::Serialize;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem document. `type` is `about:blank`: the status says what kind
/// of problem it is, the detail what to fix.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    #[schema(example = "about:blank")]
    pub kind: String,
    #[schema(example = "Not Found")]
    pub title: String,
    #[schema(example = 404)]
    pub status: u16,
    #[schema(example = "no run `0193...` in this database (`ratchet status` lists the runs)")]
    pub detail: String,
}

/// How an endpoint that takes a JSON body refuses one, in the document.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // describes responses; the values are `Problem`s
pub enum BodyRefused {
    /// The body cannot be read as JSON
    #[response(status = 400, content_type = "application/problem+json")]
    Unreadable(Problem),
    /// The body is not JSON (`Content-Type: application/json`)
    #[response(status = 415, content_type = "application/problem+json")]
    NotJson(Problem),
    /// The body is JSON of another shape (an unknown field, a wrong type)
    #[response(status = 422, content_type = "application/problem+json")]
    WrongShape(Problem),
}

impl Problem {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            kind: "about:blank".into(),
            title: status.canonical_reason().unwrap_or("Error").into(),
            status: status.as_u16(),
            detail: detail.into(),
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(self)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(PROBLEM_JSON),
        );
        response
    }
}

impl From<ClientError> for Problem {
    fn from(e: ClientError) -> Self {
        let status = match e.kind() {
            ErrorKind::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let detail = e.to_string().replace('\n', " ");
        if status.is_server_error() {
            tracing::error!("{detail}");
        }
        Self::new(status, detail)
    }
}

impl From<JsonRejection> for Problem {
    fn from(r: JsonRejection) -> Self {
        // 400 unreadable, 415 not JSON, 422 JSON of the wrong shape.
        Self::new(
            r.status(),
            format!("{}: send a JSON object as the body", r.body_text()),
        )
    }
}

impl From<QueryRejection> for Problem {
    fn from(r: QueryRejection) -> Self {
        Self::bad_request(r.body_text())
    }
}
