//! Test plugin: a stage as components were built before contract 0.2.0,
//! with the 0.1.0 bindings. It asks one prompt, fails its first attempt
//! after the model call, and proposes the journaled answer.

#[allow(clippy::too_many_arguments)] // generated code
mod bindings {
    wit_bindgen::generate!({
        world: "stage",
        path: "../../plugin-sdk/wit-0.1.0",
    });
}

use bindings::ratchet::stage::log::{Level, log};
use bindings::ratchet::stage::model::{Request, generate};
use bindings::{Artifact, Guest, StageContext, StageError};

struct Contract01;

impl Guest for Contract01 {
    fn describe() -> String {
        include_str!("../plugin.toml").to_string()
    }

    fn run(ctx: StageContext, inputs: Vec<Artifact>) -> Result<Vec<Artifact>, StageError> {
        let topic = inputs
            .iter()
            .find(|a| a.name == "topic")
            .map(|a| String::from_utf8_lossy(&a.bytes).into_owned())
            .ok_or_else(|| StageError::Fatal("missing input `topic`".into()))?;
        let request = Request {
            prompt: format!("Write a short announcement about {topic}."),
            max_tokens: None,
        };
        let answer = generate(&request).map_err(|e| StageError::Fatal(format!("{e:?}")))?;
        log(
            Level::Info,
            &format!("attempt {} asked 0.1.0-style", ctx.attempt),
        );
        if ctx.attempt == 1 {
            return Err(StageError::Retryable("failing after the model call".into()));
        }
        Ok(vec![Artifact {
            name: "draft".into(),
            media_type: "text/plain; charset=utf-8".into(),
            bytes: answer.into_bytes(),
        }])
    }
}

bindings::export!(Contract01 with_types_in bindings);
