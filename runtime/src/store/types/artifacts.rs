//! Artifacts as the store writes and reads them, and a stage's journaled
//! calls (model answers and HTTP responses): both written canonical-first.

use serde::Serialize;

use super::Payload;
use crate::llm::{FinishReason, Usage};

#[derive(Debug, Clone)]
pub struct LoadedInput {
    pub input: String,
    pub from_stage: String,
    pub from_output: String,
    /// `None` when the bound artifact does not exist (a broken invariant).
    pub artifact: Option<Artifact>,
}

/// A canonical-first insert of `artifact` under `(run_id, stage,
/// artifact.name)`, borrowed from whoever owns the bytes (a completion
/// never copies its proposals).
#[derive(Debug, Clone, Copy)]
pub struct ArtifactPut<'a> {
    pub run_id: &'a str,
    pub stage: &'a str,
    pub artifact: &'a Payload,
    pub attempt: i64,
    pub plugin_digest: Option<&'a str>,
    pub now: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalArtifact {
    pub digest: String,
    pub inserted: bool,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ArtifactMeta {
    pub run_id: String,
    pub stage: String,
    pub output: String,
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    pub attempt: i64,
    pub plugin_digest: Option<String>,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
}

#[derive(Debug, Clone)]
pub struct Artifact {
    pub meta: ArtifactMeta,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct ModelCallPut {
    pub run_id: String,
    pub stage: String,
    pub index: i64,
    pub request_digest: String,
    /// The answer, or with `rejected` the backend's reason for refusing
    /// (empty for an HTTP response: its body is in `http`).
    pub response: String,
    pub rejected: bool,
    pub attempt: i64,
    pub now: i64,
    /// The tokens the backend counted for this answer, if it said.
    pub usage: Option<Usage>,
    /// Why the answer ended (`None` for a refusal).
    pub finish_reason: Option<FinishReason>,
    /// The model that answered, as the backend named it.
    pub model: Option<String>,
    pub kind: CallKind,
    /// An HTTP call's response (`None` for a model call and a refusal).
    pub http: Option<HttpReply>,
}

impl ModelCallPut {
    /// What the `response` column holds: an HTTP response's body, or the
    /// answer (or refusal) as text.
    pub(crate) fn stored_response(&self) -> &[u8] {
        match &self.http {
            Some(reply) => &reply.body,
            None => self.response.as_bytes(),
        }
    }

    /// An HTTP response's headers as the JSON list stored with it.
    pub(crate) fn http_headers_json(&self) -> Option<String> {
        let reply = self.http.as_ref()?;
        serde_json::to_string(&reply.headers).ok()
    }
}

/// What a journaled call asked: the model, or an HTTP server (`wasi:http`).
/// Both share a stage's call index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CallKind {
    #[default]
    Model,
    Http,
}

impl CallKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Model => "model",
            CallKind::Http => "http",
        }
    }

    /// `model request DIGEST` or `HTTP request DIGEST`, for messages.
    pub fn request(self, digest: &str) -> String {
        let kind = match self {
            CallKind::Model => "model",
            CallKind::Http => "HTTP",
        };
        format!("{kind} request {digest}")
    }
}

/// An HTTP response as journaled, every granted secret's value already
/// replaced by its placeholder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct HttpReply {
    pub status: u16,
    /// `[name, value]` pairs, in the order the server sent them.
    #[schema(value_type = Vec<Vec<String>>)]
    pub headers: Vec<(String, String)>,
    /// The body, base64 in JSON.
    #[serde(serialize_with = "as_base64")]
    #[schema(value_type = String, format = Byte)]
    pub body: Vec<u8>,
}

fn as_base64<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    use base64::Engine;
    s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// One call of a stage's journal: a model call or an HTTP request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ModelCall {
    pub run_id: String,
    pub stage: String,
    pub index: i64,
    pub request_digest: String,
    /// The answer, or with `rejected` the backend's reason for refusing.
    pub response: String,
    /// The backend refused the request: a retry is refused the same way.
    pub rejected: bool,
    /// The attempt whose answer this is.
    pub attempt: i64,
    /// The tokens the backend counted for this answer, if it said.
    pub usage: Option<Usage>,
    /// Why the answer ended; `None` for a refusal and for answers journaled
    /// before contract 0.2.0.
    pub finish_reason: Option<FinishReason>,
    /// The model that answered, as the backend named it.
    pub model: Option<String>,
    pub kind: CallKind,
    /// An HTTP call's response (`None` for a model call and a refusal).
    pub http: Option<HttpReply>,
}
