//! Model backends behind the `model.generate` capability. The built-in one is
//! stochastic on purpose: two calls with one prompt answer differently.

mod openai;

pub use openai::{OpenAiConfig, OpenAiConfigError, OpenAiModel};

use async_trait::async_trait;
use rand::Rng;
use rand::seq::IndexedRandom;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelRequest {
    pub prompt: String,
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// Rate limits, timeouts, 5xx: a later attempt may succeed.
    #[error("model backend unavailable: {0}")]
    Unavailable(String),
    /// The request itself is refused.
    #[error("model backend rejected the request: {0}")]
    Rejected(String),
}

/// A backend's answer: its text, and the tokens it counted when it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub text: String,
    pub usage: Option<Usage>,
}

impl Answer {
    /// An answer whose backend counts no tokens.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            usage: None,
        }
    }
}

/// Tokens a model call used, as its backend counted them.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
pub struct Usage {
    /// Of the request.
    pub prompt_tokens: u32,
    /// Of the answer.
    pub completion_tokens: u32,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Self) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
    }
}

#[async_trait]
pub trait ModelBackend: Send + Sync + 'static {
    /// A short name recorded in logs (`stochastic`, `openai:gpt-4o`).
    fn name(&self) -> String;
    async fn generate(&self, request: &ModelRequest) -> Result<Answer, ModelError>;
}

/// Words, as the built-in backend counts its tokens.
fn words(text: &str) -> u32 {
    u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX)
}

/// Answers with random text: the embedded default, and the reason retries
/// must replay the journal instead of asking again.
#[derive(Debug, Default, Clone, Copy)]
pub struct StochasticModel;

const OPENERS: [&str; 6] = [
    "Announcing",
    "Meet",
    "Say hello to",
    "Introducing",
    "Today we ship",
    "Here is",
];
const ADJECTIVES: [&str; 8] = [
    "faster",
    "safer",
    "leaner",
    "durable",
    "friendlier",
    "sharper",
    "calmer",
    "bolder",
];
const CLOSERS: [&str; 5] = [
    "Try it today.",
    "Upgrade when ready.",
    "Tell us what you think.",
    "Your pipelines will thank you.",
    "No restarts required.",
];

#[async_trait]
impl ModelBackend for StochasticModel {
    fn name(&self) -> String {
        "stochastic".to_string()
    }

    /// Counts a word as a token, so that the demo and the tests have
    /// usage to record without a tokenizer.
    async fn generate(&self, request: &ModelRequest) -> Result<Answer, ModelError> {
        let mut rng = rand::rng();
        let topic = request
            .prompt
            .split_once("about ")
            .map(|(_, t)| t.trim_end_matches('.'))
            .unwrap_or("it");
        let mut text = format!(
            "{} {} {}: {} and {}, build {:04x}. {}",
            OPENERS.choose(&mut rng).unwrap_or(&"Here is"),
            topic,
            rng.random_range(1..100),
            ADJECTIVES.choose(&mut rng).unwrap_or(&"new"),
            ADJECTIVES.choose(&mut rng).unwrap_or(&"improved"),
            rng.random::<u16>(),
            CLOSERS.choose(&mut rng).unwrap_or(&""),
        );
        if let Some(max) = request.max_tokens {
            let words: Vec<&str> = text.split_whitespace().take(max as usize).collect();
            text = words.join(" ");
        }
        let usage = Usage {
            prompt_tokens: words(&request.prompt),
            completion_tokens: words(&text),
        };
        Ok(Answer {
            text,
            usage: Some(usage),
        })
    }
}
