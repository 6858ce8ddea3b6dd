//! A chat request to the model, built step by step, and its reply.

use crate::bindings::ratchet::stage::model::{
    Answer, FinishReason, JsonSchema, Message, Request, ResponseFormat, Role, Usage,
};

/// The messages and options of one model call.
///
/// ```
/// use ratchet_plugin_sdk::Chat;
/// let chat = Chat::new()
///     .system("You answer in one sentence.")
///     .user("What is a ratchet?")
///     .temperature(0.2)
///     .max_tokens(60);
/// ```
#[derive(Debug, Clone)]
pub struct Chat {
    request: Request,
}

impl Default for Chat {
    fn default() -> Self {
        Self::new()
    }
}

impl Chat {
    /// No messages, the backend's default model and options, free text.
    pub fn new() -> Self {
        Self {
            request: Request {
                messages: Vec::new(),
                model: None,
                temperature: None,
                top_p: None,
                stop: Vec::new(),
                max_tokens: None,
                response_format: ResponseFormat::Text,
            },
        }
    }

    pub fn message(mut self, role: Role, content: impl Into<String>) -> Self {
        self.request.messages.push(Message {
            role,
            content: content.into(),
        });
        self
    }

    pub fn system(self, content: impl Into<String>) -> Self {
        self.message(Role::System, content)
    }

    pub fn user(self, content: impl Into<String>) -> Self {
        self.message(Role::User, content)
    }

    pub fn assistant(self, content: impl Into<String>) -> Self {
        self.message(Role::Assistant, content)
    }

    /// A model the operator allows by name (`[model] allowed`).
    pub fn model(mut self, name: impl Into<String>) -> Self {
        self.request.model = Some(name.into());
        self
    }

    pub fn temperature(mut self, t: f32) -> Self {
        self.request.temperature = Some(t);
        self
    }

    pub fn top_p(mut self, p: f32) -> Self {
        self.request.top_p = Some(p);
        self
    }

    /// The answer ends before this sequence.
    pub fn stop(mut self, sequence: impl Into<String>) -> Self {
        self.request.stop.push(sequence.into());
        self
    }

    pub fn max_tokens(mut self, n: u32) -> Self {
        self.request.max_tokens = Some(n);
        self
    }

    /// The answer must be one JSON value that fits `schema`.
    pub fn json_schema(mut self, name: &str, schema: &serde_json::Value) -> Self {
        self.request.response_format = ResponseFormat::Json(JsonSchema {
            name: name.to_string(),
            schema: schema.to_string(),
        });
        self
    }

    pub(crate) fn request(&self) -> &Request {
        &self.request
    }
}

/// The model's answer, as journaled by the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub text: String,
    pub finish_reason: FinishReason,
    /// The model that answered, as the backend names it.
    pub model: String,
    pub usage: Option<Usage>,
}

impl From<Answer> for Reply {
    fn from(a: Answer) -> Self {
        Self {
            text: a.text,
            finish_reason: a.finish_reason,
            model: a.model,
            usage: a.usage,
        }
    }
}
