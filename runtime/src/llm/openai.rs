//! An OpenAI-compatible chat-completions backend. It answers through the same
//! journal as every backend: a retried attempt is handed the recorded answer
//! and never reaches this client.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Answer, ModelBackend, ModelError, ModelRequest, Usage};

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

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: [Message<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
}

#[derive(Deserialize)]
struct ChatResponse {
    choices: Vec<Choice>,
    /// Servers that count tokens say so (`total_tokens` too); some do
    /// not.
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
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
        let body = ChatRequest {
            model: &self.config.model,
            messages: [Message {
                role: "user",
                content: &request.prompt,
            }],
            max_tokens: request.max_tokens,
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
        let text = parsed
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .ok_or_else(|| ModelError::Unavailable("the answer has no message content".into()))?;
        Ok(Answer {
            text,
            usage: parsed.usage,
        })
    }
}
