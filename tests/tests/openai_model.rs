//! The OpenAI-compatible model backend against a real HTTP server on
//! 127.0.0.1 that answers in the chat-completions format, including rate
//! limits, server errors and a server that never answers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use ratchet_runtime::crash::CRASH_EXIT_CODE;
use ratchet_runtime::llm::{
    Answer, FinishReason, Message, ModelBackend, ModelError, ModelRequest, OpenAiConfig,
    OpenAiModel, ResponseFormat, Role, Schema, Usage,
};
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness, output, ratchet};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

/// What the server does with the next request.
#[derive(Debug, Clone)]
enum Reply {
    /// Answers with the tokens used: 11 of the prompt, one per word.
    Answer(&'static str),
    /// Answers without counting tokens, as some servers do.
    Uncounted(&'static str),
    /// Cut at the token limit, naming the model that answered.
    Cut(&'static str),
    Status(u16),
    /// Never answers.
    Hang,
}

#[derive(Default)]
struct Script {
    replies: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<(Option<String>, Value)>>,
}

async fn chat(
    State(script): State<Arc<Script>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    script.seen.lock().expect("seen").push((auth, body));
    let reply = script.replies.lock().expect("replies").pop_front();
    let completion = |text: &str| {
        json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        })
    };
    match reply.unwrap_or(Reply::Status(503)) {
        Reply::Answer(text) => {
            let words = text.split_whitespace().count();
            let mut answer = completion(text);
            answer["usage"] = json!({
                "prompt_tokens": 11, "completion_tokens": words, "total_tokens": 11 + words,
            });
            (StatusCode::OK, Json(answer))
        }
        Reply::Uncounted(text) => (StatusCode::OK, Json(completion(text))),
        Reply::Cut(text) => {
            let mut answer = completion(text);
            answer["choices"][0]["finish_reason"] = json!("length");
            answer["model"] = json!("served-model-2026");
            (StatusCode::OK, Json(answer))
        }
        Reply::Status(code) => (
            StatusCode::from_u16(code).expect("status"),
            Json(json!({"error": {"message": format!("scripted {code}")}})),
        ),
        Reply::Hang => std::future::pending().await,
    }
}

/// Starts the server; returns its base URL (up to `/v1`) and its script.
async fn server(replies: &[Reply]) -> (String, Arc<Script>) {
    let script = Arc::new(Script::default());
    script
        .replies
        .lock()
        .expect("replies")
        .extend(replies.iter().cloned());
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(script.clone());
    let addr = ratchet_tests::serve_http(app).await;
    (format!("http://{addr}/v1"), script)
}

fn client(base_url: &str, timeout: Duration) -> OpenAiModel {
    OpenAiModel::new(OpenAiConfig {
        base_url: base_url.to_string(),
        model: "test-model".into(),
        api_key: Some("sk-test".into()),
        timeout,
    })
    .expect("client")
}

fn request(prompt: &str) -> ModelRequest {
    ModelRequest::prompt(prompt, Some(64))
}

/// An answer as the backend reports one the server ended normally.
fn answered(text: &str, usage: Option<Usage>) -> Answer {
    Answer {
        usage,
        model: Some("test-model".into()),
        ..Answer::text(text)
    }
}

#[tokio::test]
async fn a_chat_completion_is_asked_and_answered() {
    let replies = [
        Reply::Answer("Ratchet 1.0 ships"),
        Reply::Uncounted("Ratchet 1.1 ships"),
    ];
    let (url, script) = server(&replies).await;
    let model = client(&url, Duration::from_secs(30));
    let answer = model.generate(&request("Write a headline")).await;
    let usage = Usage {
        prompt_tokens: 11,
        completion_tokens: 3,
    };
    assert_eq!(answer, Ok(answered("Ratchet 1.0 ships", Some(usage))));
    let answer = model.generate(&request("Write another")).await;
    assert_eq!(answer, Ok(answered("Ratchet 1.1 ships", None)));
    let seen = script.seen.lock().expect("seen");
    let (auth, body) = &seen[0];
    assert_eq!(auth.as_deref(), Some("Bearer sk-test"));
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["messages"][0]["role"], "user");
    assert_eq!(body["messages"][0]["content"], "Write a headline");
    assert_eq!(body["max_tokens"], 64);
}

/// Contract 0.2.0's request maps onto chat completions: every message, the
/// options, a named model and the schema as `response_format`; the answer
/// keeps the finish reason and the model the server names. Seen failing
/// with the options left out of the body.
#[tokio::test]
async fn a_chat_with_options_and_a_schema_is_sent_whole() {
    let (url, script) = server(&[Reply::Cut(r#"{"n": 1}"#)]).await;
    let model = client(&url, Duration::from_secs(30));
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let asked = ModelRequest {
        messages: vec![
            Message {
                role: Role::System,
                content: "Be brief.".into(),
            },
            Message {
                role: Role::User,
                content: "Count.".into(),
            },
            Message {
                role: Role::Assistant,
                content: "One?".into(),
            },
            Message {
                role: Role::User,
                content: "Go on.".into(),
            },
        ],
        model: Some("small-model".into()),
        temperature: Some(0.25),
        top_p: Some(0.5),
        stop: vec!["\n\n".into()],
        max_tokens: Some(8),
        format: ResponseFormat::Json {
            name: "count".into(),
            schema: Schema::new(schema.clone()).expect("schema"),
        },
    };
    let answer = model.generate(&asked).await.expect("answer");
    assert_eq!(answer.finish_reason, FinishReason::Length);
    assert_eq!(answer.model.as_deref(), Some("served-model-2026"));
    let seen = script.seen.lock().expect("seen");
    let body = &seen[0].1;
    assert_eq!(body["model"], "small-model");
    assert_eq!(body["messages"].as_array().map(Vec::len), Some(4));
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(body["messages"][2]["role"], "assistant");
    assert_eq!(
        (body["temperature"].clone(), body["top_p"].clone()),
        (json!(0.25), json!(0.5))
    );
    assert_eq!(body["stop"], json!(["\n\n"]));
    assert_eq!(body["max_tokens"], 8);
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "count", "schema": schema}})
    );
}

#[tokio::test]
async fn rate_limits_and_server_errors_may_pass_bad_requests_will_not() {
    let replies = [
        Reply::Status(429),
        Reply::Status(500),
        Reply::Status(400),
        Reply::Status(401),
    ];
    let (url, _script) = server(&replies).await;
    let model = client(&url, Duration::from_secs(30));
    for expected in ["429", "500"] {
        match model.generate(&request("q")).await {
            Err(ModelError::Unavailable(m)) => assert!(m.contains(expected), "{m}"),
            other => panic!("HTTP {expected} must be retryable: {other:?}"),
        }
    }
    for expected in ["400", "401"] {
        match model.generate(&request("q")).await {
            Err(ModelError::Rejected(m)) => assert!(m.contains(expected), "{m}"),
            other => panic!("HTTP {expected} must be fatal: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_retryably() {
    let (url, _script) = server(&[Reply::Hang]).await;
    let model = client(&url, Duration::from_millis(200));
    match model.generate(&request("q")).await {
        Err(ModelError::Unavailable(m)) => assert!(m.contains("no answer within 200 ms"), "{m}"),
        other => panic!("a timeout must be retryable: {other:?}"),
    }
}

#[tokio::test]
async fn a_bad_base_url_is_refused_up_front() {
    let err = OpenAiModel::new(OpenAiConfig {
        base_url: "ftp://models.example".into(),
        model: "m".into(),
        api_key: None,
        timeout: Duration::from_secs(1),
    })
    .expect_err("ftp is not http");
    assert!(err.to_string().contains("ftp://models.example"), "{err}");
}

/// A real worker process on the OpenAI backend is killed right after the
/// draft's answer is journaled; the server would answer the retry
/// differently, but the retry never asks: the run continues from the
/// journaled, canonical answer. Seen failing with the host ignoring the
/// journal (the server is asked twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_journaled_so_a_retry_never_asks_again() {
    let replies = [
        Reply::Answer("the first answer"),
        Reply::Answer("a second, different answer"),
    ];
    let (url, script) = server(&replies).await;
    let h = Harness::new().await;
    h.register(&DEMO_PLUGINS).await;
    let run = h.submit_demo().await;
    let worker = |id: &str| {
        let mut cmd = ratchet(BIN, &h.url);
        cmd.args(["--model", "openai", "--model-url", &url])
            .args(["--model-name", "test-model", "worker", "--until-idle"])
            .args(["--lease-ms", "300", "--worker-id", id])
            .env("RATCHET_MODEL_API_KEY", "sk-test");
        cmd
    };
    let mut doomed = worker("doomed");
    doomed.env("FAILPOINTS", "after_model_call=return(exit)");
    let out = output(doomed).await;
    assert_eq!(out.status.code(), Some(CRASH_EXIT_CODE), "{out:?}");
    let out = output(worker("survivor")).await;
    assert!(out.status.success(), "{out:?}");

    h.assert_demo_run_converged(&run).await;
    let draft = h
        .store
        .artifact_get(&run, "draft", "draft")
        .await
        .expect("artifact")
        .expect("draft");
    assert_eq!(draft.bytes, b"the first answer");
    assert_eq!(script.seen.lock().expect("seen").len(), 1, "asked once");
    let journal = h.store.model_call_list(&run).await.expect("journal");
    let usage = journal[0].usage.expect("the server counted tokens");
    assert_eq!(
        (usage.prompt_tokens, usage.completion_tokens),
        (11, 3),
        "the server's count, journaled with its answer"
    );
}

#[tokio::test]
async fn the_cli_refuses_a_bad_model_url_in_one_line() {
    let h = Harness::on(
        Backend::Sqlite,
        Arc::new(ratchet_runtime::clock::SystemClock),
    )
    .await
    .expect("sqlite");
    let mut cmd = ratchet(BIN, &h.url);
    cmd.args(["--model", "openai", "--model-url", "not a url", "status"]);
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("`not a url`"), "{stderr}");
}

/// The demo's crashing child worker runs with the parent's global options.
/// Seen failing before the fix (the child got only `--db`): the child asked
/// the built-in stochastic model, so the server was never asked and the
/// draft was the stochastic answer replayed under the OpenAI backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_crashing_worker_asks_the_parents_model_backend() {
    let (url, script) = server(&[Reply::Answer("the server's announcement")]).await;
    let h = Harness::new().await;
    let mut demo = ratchet(BIN, &h.url);
    demo.args(["--model", "openai", "--model-url", &url])
        .args(["--model-name", "test-model", "demo", "--runs", "1"])
        .env("RATCHET_MODEL_API_KEY", "sk-test");
    let out = output(demo).await;
    assert!(out.status.success(), "{out:?}");
    let seen = script.seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 1, "the child asked the server once: {seen:?}");
    assert_eq!(seen[0].1["model"], "test-model");
    let runs = h.store.run_list().await.expect("runs");
    let calls = h.store.model_call_list(&runs[0].id).await.expect("journal");
    assert_eq!(calls[0].response, "the server's announcement");
    assert_eq!(calls[0].attempt, 1, "answered to the crashed attempt");
}
