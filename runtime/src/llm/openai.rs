//! An OpenAI-compatible chat-completions backend. It answers through the same
//! journal as every backend: a retried attempt is handed the recorded answer
//! and never reaches this client.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{
    Answer, FinishReason, Message, ModelBackend, ModelError, ModelRequest, ResponseFormat, Schema,
    Usage,
};

/// Where and how to reach the model.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Up to and including the version, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// For the whole request, connect to last byte.
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct OpenAiModel {
    config: OpenAiConfig,
    endpoint: reqwest::Url,
    client: reqwest::Client,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenAiConfigError {
    #[error("model base URL `{0}` is not a valid http(s) URL, e.g. https://api.openai.com/v1")]
    BadUrl(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// A chat completion request; unset options are left out, for servers
/// that refuse what they do not know.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: &'a [Message],
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Format<'a>>,
}

/// Structured output: `{"type": "json_schema", "json_schema": {...}}`.
#[derive(Serialize)]
#[serde(tag = "type", rename = "json_schema")]
struct Format<'a> {
    json_schema: NamedSchema<'a>,
}

#[derive(Serialize)]
struct NamedSchema<'a> {
    name: &'a str,
    schema: &'a Schema,
}

#[derive(Deserialize)]
struct ChatResponse {
    choices: Vec<Choice>,
    /// Servers that count tokens say so (`total_tokens` too); some do
    /// not.
    usage: Option<Usage>,
    model: Option<String>,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct AnswerMessage {
    content: Option<String>,
}

/// Longest part of an error body quoted in a message.
const QUOTE: usize = 200;

impl OpenAiModel {
    pub fn new(config: OpenAiConfig) -> Result<Self, OpenAiConfigError> {
        let bad = || OpenAiConfigError::BadUrl(config.base_url.clone());
        let mut endpoint = reqwest::Url::parse(&config.base_url).map_err(|_| bad())?;
        if !matches!(endpoint.scheme(), "http" | "https") {
            return Err(bad());
        }
        endpoint
            .path_segments_mut()
            .map_err(|_| bad())?
            .pop_if_empty()
            .extend(["chat", "completions"]);
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| OpenAiConfigError::Client(e.to_string()))?;
        Ok(Self {
            config,
            endpoint,
            client,
        })
    }
}

#[async_trait]
impl ModelBackend for OpenAiModel {
    fn name(&self) -> String {
        format!("openai:{}", self.config.model)
    }

    async fn generate(&self, request: &ModelRequest) -> Result<Answer, ModelError> {
        let model = request.model.as_deref().unwrap_or(&self.config.model);
        let body = ChatRequest {
            model,
            messages: &request.messages,
            max_tokens: request.max_tokens,
            temperature: request.temperature,
            top_p: request.top_p,
            stop: &request.stop,
            response_format: match &request.format {
                ResponseFormat::Text => None,
                ResponseFormat::Json { name, schema } => Some(Format {
                    json_schema: NamedSchema { name, schema },
                }),
            },
        };
        let mut http = self.client.post(self.endpoint.clone()).json(&body);
        if let Some(key) = &self.config.api_key {
            http = http.bearer_auth(key);
        }
        let response = http.send().await.map_err(|e| {
            let what = if e.is_timeout() {
                format!("no answer within {} ms", self.config.timeout.as_millis())
            } else {
                format!("request failed: {e}")
            };
            ModelError::Unavailable(what)
        })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| ModelError::Unavailable(format!("reading the answer failed: {e}")))?;
        if !status.is_success() {
            let quoted: String = text.chars().take(QUOTE).collect();
            let message = format!("HTTP {status}: {quoted}");
            // Rate limits, timeouts and server errors may pass; anything
            // else (bad key, unknown model, bad request) will not.
            return Err(
                if status.as_u16() == 429 || status.as_u16() == 408 || status.is_server_error() {
                    ModelError::Unavailable(message)
                } else {
                    ModelError::Rejected(message)
                },
            );
        }
        let parsed: ChatResponse = serde_json::from_str(&text).map_err(|e| {
            ModelError::Unavailable(format!("the answer is not a chat completion: {e}"))
        })?;
        let no_content = || ModelError::Unavailable("the answer has no message content".into());
        let choice = parsed.choices.into_iter().next().ok_or_else(no_content)?;
        let text = choice.message.content.ok_or_else(no_content)?;
        Ok(Answer {
            text,
            usage: parsed.usage,
            finish_reason: choice
                .finish_reason
                .as_deref()
                .map_or(FinishReason::Stop, FinishReason::parse),
            model: Some(parsed.model.unwrap_or_else(|| model.to_string())),
        })
    }
}
