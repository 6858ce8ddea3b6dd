//! The native test harness, on the stage shapes plugin authors get wrong.

use ratchet_plugin_sdk::testing::{Harness, Outcome};
use ratchet_plugin_sdk::{
    Context, Error, HttpRequest, HttpResponse, Inputs, ModelError, Outputs, Stage,
};

/// A stage whose output is the model's answer: non-deterministic.
struct Draft;

impl Stage for Draft {
    const MANIFEST: &'static str = r#"
        name = "draft"
        version = "1.0.0"
        inputs = ["topic"]
        outputs = ["draft"]
        capabilities = ["model", "log"]
    "#;

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let answer = ctx.generate(&format!("Announce {}", inputs.text("topic")?))?;
        ctx.info(&format!("attempt {} drafted", ctx.attempt()));
        Ok(Outputs::new().text("draft", answer))
    }
}

/// Seen failing with the journal switched off in `SimHost::answer` (every
/// attempt asks the model afresh): the committed draft is then attempt 2's.
#[test]
fn a_retry_after_a_crash_commits_the_journaled_answer() {
    let report = Harness::<Draft>::new()
        .input_text("topic", "Ratchet")
        .model(|attempt, _| Ok(format!("answer of attempt {attempt}")))
        .crash_after_attempt(1)
        .run();
    assert_eq!(report.attempts.len(), 2);
    assert_eq!(report.attempts[0].outcome, Outcome::Crashed);
    assert_eq!(report.attempts[1].outcome, Outcome::Committed);
    assert!(report.attempts[1].model_calls[0].replayed);
    assert_eq!(report.text("draft"), "answer of attempt 1");
    assert_eq!(report.attempts[1].logs.len(), 1, "log is granted");
}

/// Asks a question that changes between attempts.
struct AttemptInPrompt;

impl Stage for AttemptInPrompt {
    const MANIFEST: &'static str = r#"
        name = "attempt-in-prompt"
        version = "1.0.0"
        outputs = ["draft"]
        capabilities = ["model"]
    "#;

    fn run(ctx: &Context, _: &Inputs) -> Result<Outputs, Error> {
        let answer = ctx.generate(&format!("attempt {}", ctx.attempt()))?;
        Ok(Outputs::new().text("draft", answer))
    }
}

#[test]
fn a_question_that_changes_between_attempts_fails_the_stage() {
    let report = Harness::<AttemptInPrompt>::new()
        .crash_after_attempt(1)
        .run();
    assert!(report.committed.is_none());
    let failure = report.failure().expect("the stage failed");
    assert!(!failure.retryable, "{failure}");
    assert!(failure.message.contains("non-determinism"), "{failure}");
}

#[test]
fn an_unavailable_model_is_retried_and_a_later_answer_commits() {
    let report = Harness::<Draft>::new()
        .input_text("topic", "Ratchet")
        .model(|attempt, _| match attempt {
            1 => Err(ModelError::Unavailable("429 rate limited".into())),
            n => Ok(format!("answer of attempt {n}")),
        })
        .run();
    assert!(matches!(&report.attempts[0].outcome, Outcome::Failed(e) if e.retryable));
    assert_eq!(report.text("draft"), "answer of attempt 2");
}

/// Returns an output its manifest does not declare, and calls the model
/// without asking for it.
struct Sloppy;

impl Stage for Sloppy {
    const MANIFEST: &'static str = r#"
        name = "sloppy"
        version = "1.0.0"
        outputs = ["draft"]
    "#;

    fn run(ctx: &Context, _: &Inputs) -> Result<Outputs, Error> {
        ctx.info("dropped: log is not granted");
        let model = ctx.generate("hello").map_err(|e| e.message).err();
        Ok(Outputs::new()
            .text("draft", model.unwrap_or_default())
            .text("extra", "not declared"))
    }
}

#[test]
fn the_output_contract_and_capabilities_are_enforced() {
    let report = Harness::<Sloppy>::new().run();
    assert_eq!(report.attempts.len(), 1, "a contract breach is fatal");
    let attempt = &report.attempts[0];
    assert!(attempt.logs.is_empty());
    assert!(
        attempt.model_calls[0]
            .answer
            .as_ref()
            .is_err_and(|e| e.contains("AccessDenied")),
        "{attempt:?}"
    );
    let failure = report.failure().expect("fatal");
    assert!(
        failure.message.contains("`extra` is not declared"),
        "{failure}"
    );
}

/// A structured, dated stage on contract 0.2.0.
struct Dated;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Verdict {
    ok: bool,
    #[schemars(range(min = 1, max = 3))]
    score: u8,
}

impl Stage for Dated {
    const MANIFEST: &'static str = "name = \"dated\"\nversion = \"1.0.0\"\noutputs = [\"verdict\"]\ncapabilities = [\"model\"]";
    fn run(ctx: &Context, _: &Inputs) -> Result<Outputs, Error> {
        let secs = ctx
            .now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let pick = ctx.random_u64() % 1000;
        let chat = ratchet_plugin_sdk::Chat::new()
            .system("judge")
            .user(format!("at {secs}, pick {pick}: ok?"));
        let verdict: Verdict = ctx.structured(&chat)?;
        Ok(Outputs::new().text(
            "verdict",
            format!("{secs} {pick} {} {}", verdict.ok, verdict.score),
        ))
    }
}

/// The harness checks a structured answer as the host does: one that does
/// not fit fails the attempt retryably and is not journaled; the fixed
/// clock and seeded numbers make the retry ask the same question. Seen
/// failing with the schema check left out of the harness (the misfit
/// reached the stage, which failed to decode it, fatally).
#[test]
fn a_structured_answer_that_does_not_fit_is_retried() {
    let report = Harness::<Dated>::new()
        .clock(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000))
        .model(|attempt, prompt| {
            assert!(prompt.starts_with("at 1000, pick "), "{prompt}");
            Ok(match attempt {
                1 => r#"{"ok": true, "score": 9}"#.to_string(),
                _ => r#"{"ok": true, "score": 2}"#.to_string(),
            })
        })
        .run();
    assert!(
        matches!(&report.attempts[0].outcome, Outcome::Failed(e) if e.retryable && e.message.contains("does not fit")),
        "{:?}",
        report.attempts
    );
    let prompts: Vec<&str> = report
        .attempts
        .iter()
        .flat_map(|a| a.model_calls.iter().map(|c| c.prompt.as_str()))
        .collect();
    assert_eq!(
        prompts[0], prompts[1],
        "the same date and pick on the retry"
    );
    assert!(
        report.text("verdict").ends_with("true 2"),
        "{}",
        report.text("verdict")
    );
}

/// Fetches a page, then asks the model about it: an HTTP call and a model
/// call sharing the journal's index, as in the runtime.
struct FetchThenAsk;

impl Stage for FetchThenAsk {
    const MANIFEST: &'static str = r#"
        name = "fetch-then-ask"
        version = "1.0.0"
        outputs = ["answer"]
        capabilities = ["http", "model"]
        allowed_hosts = ["example.org"]
    "#;

    fn run(ctx: &Context, _: &Inputs) -> Result<Outputs, Error> {
        let page = ctx.http(
            &HttpRequest::get("https://example.org/page")
                .header("authorization", "Bearer {{secret:key}}"),
        )?;
        let answer = ctx.generate(&format!("Summarise: {}", page.text()?))?;
        Ok(Outputs::new().text("answer", answer))
    }
}

/// The server answers differently on every request; after a crash the
/// retry is handed the recorded page and the server is asked once. Seen
/// failing with HTTP responses left out of the simulated journal (the
/// server counted two, and the retry's model call asked about another
/// page: non-determinism).
#[test]
fn a_retry_after_a_crash_replays_the_recorded_response() {
    let asked = std::rc::Rc::new(std::cell::Cell::new(0));
    let counter = asked.clone();
    let report = Harness::<FetchThenAsk>::new()
        .http(move |attempt, request| {
            counter.set(counter.get() + 1);
            assert_eq!(request.url, "https://example.org/page");
            Ok(HttpResponse::new(200, format!("page of attempt {attempt}")))
        })
        .model(|_, prompt| Ok(prompt.to_string()))
        .crash_after_attempt(1)
        .run();
    assert_eq!(asked.get(), 1, "the server was asked once");
    assert!(report.attempts[1].http_calls[0].replayed);
    assert_eq!(report.text("answer"), "Summarise: page of attempt 1");
}

/// A recorded reply stands in for the server; a request nobody recorded a
/// reply for fails the stage and says how to give one.
#[test]
fn recorded_replies_answer_by_method_and_url() {
    let report = Harness::<FetchThenAsk>::new()
        .http_reply(
            "GET",
            "https://example.org/page",
            HttpResponse::new(200, "hi"),
        )
        .model(|_, prompt| Ok(prompt.to_string()))
        .run();
    assert_eq!(report.text("answer"), "Summarise: hi");
    let report = Harness::<FetchThenAsk>::new().run();
    let failure = report.failure().expect("no reply recorded");
    assert!(failure.message.contains("http_reply"), "{failure}");
}
