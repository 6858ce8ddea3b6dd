//! The `ratchet` binary end to end: the happy path a user follows, and bad
//! input answered with one line, exit code 2 and no change to the database.

use std::process::Output;

use ratchet_runtime::digest::sha256_hex;
use ratchet_tests::{DEMO_PLUGINS, Harness, output, plugin_path, ratchet};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

async fn cli(url: &str, args: &[&str]) -> Output {
    let mut cmd = ratchet(BIN, url);
    cmd.args(args);
    output(cmd).await
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn assert_bad_input(o: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "exit code 2 expected: {o:?}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one line expected: {stderr}"
    );
    assert!(stderr.contains(needle), "`{needle}` not in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_run_work_inspect_and_audit_from_the_command_line() {
    let h = Harness::new().await;
    let url = h.url.as_str();
    for name in DEMO_PLUGINS {
        let path = plugin_path(name).display().to_string();
        let added = cli(url, &["plugin", "add", &path]).await;
        assert!(added.status.success(), "{added:?}");
        assert!(
            stdout(&added).starts_with(&format!("registered {name}@1.0.0")),
            "{}",
            stdout(&added)
        );
        let again = cli(url, &["plugin", "add", &path]).await;
        assert!(
            stdout(&again).starts_with("already registered"),
            "same bytes twice is a no-op"
        );
    }
    let listed = stdout(&cli(url, &["plugin", "list"]).await);
    assert_eq!(listed.lines().count(), 4, "{listed}");

    let input = tempfile::NamedTempFile::new().expect("input file");
    std::fs::write(input.path(), b"the command line").expect("write input");
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/demo.toml");
    let submitted = cli(
        url,
        &["run", demo, "--input", &input.path().display().to_string()],
    )
    .await;
    assert!(submitted.status.success(), "{submitted:?}");
    let run = stdout(&submitted).trim().to_string();
    assert_eq!(run.len(), 36, "prints the run id: {run}");

    let worked = cli(url, &["worker", "--until-idle", "--concurrency", "2"]).await;
    assert!(worked.status.success(), "{worked:?}");

    let status: serde_json::Value =
        serde_json::from_slice(&cli(url, &["status", &run, "--json"]).await.stdout)
            .expect("status json");
    assert_eq!(status["run"]["state"], "succeeded");
    let stages = status["stages"].as_array().expect("stages");
    assert!(
        stages
            .iter()
            .all(|s| s["state"] == "succeeded" && s["attempts"] == 1)
    );
    let draft_digest = stages[0]["artifacts"]["draft"]
        .as_str()
        .expect("digest")
        .to_string();
    // Model calls and their tokens, by stage and for the run.
    let total = &status["model"];
    assert!(total["calls"].as_u64() > Some(0), "{total}");
    assert!(total["prompt_tokens"].as_u64() > Some(0), "{total}");
    for field in ["calls", "prompt_tokens", "completion_tokens"] {
        let of_stages: u64 = stages
            .iter()
            .filter_map(|s| s["model"][field].as_u64())
            .sum();
        assert_eq!(Some(of_stages), total[field].as_u64(), "{field}");
    }
    let shown = stdout(&cli(url, &["status", &run]).await);
    let line = format!(
        "model, the whole run: {} call(s), {} prompt and {} completion tokens",
        total["calls"], total["prompt_tokens"], total["completion_tokens"]
    );
    assert!(shown.contains(&line), "{shown}");

    let raw = cli(url, &["artifacts", &run, "draft.draft", "--raw"]).await;
    assert_eq!(
        sha256_hex(&raw.stdout),
        draft_digest,
        "--raw writes the exact bytes"
    );
    let runs: serde_json::Value =
        serde_json::from_slice(&cli(url, &["status", "--json"]).await.stdout).expect("json");
    assert_eq!(runs[0]["id"], run.as_str());

    // The run's event, relayed to a sink nobody listens on: retries run
    // out, and the dead letter shows in `outbox` and in the run's status.
    let sinks = tempfile::NamedTempFile::new().expect("sinks file");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    std::fs::write(
        sinks.path(),
        format!("[[sink]]\nname = \"nobody\"\ntype = \"webhook\"\nurl = \"http://127.0.0.1:{port}/\"\nsecret_env = \"CLI_TEST_SECRET\"\nevents = [\"draft.*\"]\nmax_attempts = 2\nbackoff_ms = 1\n"),
    )
    .expect("write sinks");
    let sinks = sinks.path().display().to_string();
    let mut relay = ratchet(BIN, url);
    relay
        .args(["--sinks", &sinks, "relay", "--until-idle"])
        .env("CLI_TEST_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let relayed = output(relay).await;
    assert!(relayed.status.success(), "{relayed:?}");
    let dead: serde_json::Value = serde_json::from_slice(
        &cli(url, &["outbox", &run, "--state", "dead", "--json"])
            .await
            .stdout,
    )
    .expect("outbox json");
    assert_eq!(dead.as_array().map(Vec::len), Some(1), "{dead}");
    assert_eq!(dead[0]["event"], "draft.published");
    assert_eq!(dead[0]["attempts"], 2);
    let shown = stdout(&cli(url, &["status", &run]).await);
    assert!(
        shown.contains("delivery: draft.published to nobody: dead after 2 attempt(s); last error: retries exhausted"),
        "{shown}"
    );
    let again = cli(url, &["outbox", "redeliver", "--dead", "--json"]).await;
    let again: Option<serde_json::Value> = serde_json::from_slice(&again.stdout).ok();
    assert_eq!(again, Some(serde_json::json!({ "redelivered": 1 })));

    let audit = cli(url, &["--sinks", &sinks, "audit", "--json"]).await;
    assert!(audit.status.success(), "{audit:?}");
    let report: serde_json::Value = serde_json::from_slice(&audit.stdout).expect("audit json");
    assert_eq!(report["violations"].as_array().map(Vec::len), Some(0));
    // The same sink, told since to take only the runs' own events: the
    // audit of every run names the delivery it would no longer make (seen
    // failing with the walk over every run's deliveries skipped).
    let narrowed = tempfile::NamedTempFile::new().expect("sinks file");
    let file = std::fs::read_to_string(&sinks).expect("sinks");
    std::fs::write(narrowed.path(), file.replace("draft.*", "run.*")).expect("write sinks");
    let narrowed = narrowed.path().display().to_string();
    let audit = cli(url, &["--sinks", &narrowed, "audit", "--json"]).await;
    assert_eq!(audit.status.code(), Some(1), "{audit:?}");
    let report: serde_json::Value = serde_json::from_slice(&audit.stdout).expect("audit json");
    let detail = report["violations"][0]["detail"]
        .as_str()
        .unwrap_or_default();
    assert!(
        detail.contains("sends `draft.published` to sink `nobody`, which does not take it"),
        "{report}"
    );
    h.assert_demo_run_converged(&run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_one_line_exit_code_two_and_changes_nothing() {
    let h = Harness::new().await;
    let url = h.url.as_str();
    let dir = tempfile::tempdir().expect("dir");

    assert_bad_input(
        &cli("mysql://localhost/x", &["status"]).await,
        "unsupported database url",
    );
    assert_bad_input(
        &cli(url, &["run", "no-such-pipeline.toml"]).await,
        "no-such-pipeline.toml",
    );
    assert_bad_input(
        &cli(url, &["worker", "--concurrency", "0"]).await,
        "--concurrency",
    );
    assert_bad_input(&cli(url, &["frobnicate"]).await, "frobnicate");
    assert_bad_input(
        &cli(url, &["artifacts", "no-such-run"]).await,
        "no run `no-such-run` in this database",
    );

    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm but not really").expect("write");
    let junk = junk.display().to_string();
    assert_bad_input(
        &cli(url, &["plugin", "add", &junk]).await,
        "not a valid Wasm component",
    );
    assert_bad_input(
        &cli(url, &["plugin", "add", "missing.wasm"]).await,
        "missing.wasm",
    );
    assert!(
        h.store.plugin_list().await.expect("list").is_empty(),
        "nothing registered"
    );

    let pipeline = dir.path().join("cycle.toml");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/ui/pipeline/cycle.toml"),
        &pipeline,
    )
    .expect("copy");
    h.register(&DEMO_PLUGINS).await;
    let bad = cli(url, &["run", &pipeline.display().to_string()]).await;
    assert_bad_input(
        &bad,
        "cycle.toml:9: stages form a cycle: publish -> draft -> publish",
    );
    assert!(
        h.store.run_list().await.expect("runs").is_empty(),
        "no run was created"
    );

    // The relay's input: a sinks file, its secrets, its filters.
    assert_bad_input(&cli(url, &["relay"]).await, "needs a sinks file");
    let sinks = concat!(env!("CARGO_MANIFEST_DIR"), "/ui/sinks/unknown_type.toml");
    assert_bad_input(
        &cli(url, &["--sinks", sinks, "relay"]).await,
        "unknown_type.toml:3: sink `hooks` has type `kafka`",
    );
    let good = dir.path().join("sinks.toml");
    std::fs::write(
        &good,
        "[[sink]]\nname = \"hooks\"\ntype = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\nsecret_env = \"RATCHET_TEST_UNSET_SECRET\"\nevents = [\"*\"]\n",
    )
    .expect("write");
    assert_bad_input(
        &cli(
            url,
            &[
                "--sinks",
                &good.display().to_string(),
                "relay",
                "--until-idle",
            ],
        )
        .await,
        "`RATCHET_TEST_UNSET_SECRET` is not set",
    );
    assert_bad_input(
        &cli(url, &["outbox", "--state", "lost"]).await,
        "not a delivery state",
    );
    assert_bad_input(
        &cli(url, &["outbox", "redeliver", "999"]).await,
        "delivery 999 is not a dead letter",
    );

    let mut crashing = ratchet(BIN, url);
    crashing
        .args(["worker", "--until-idle"])
        .env("FAILPOINTS", "after_lunch=panic");
    assert_bad_input(&output(crashing).await, "not a crash point");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stops_cleanly_on_sigterm() {
    let h = Harness::new().await;
    let mut cmd = ratchet(BIN, &h.url);
    cmd.args(["worker", "--concurrency", "2"])
        .env("RATCHET_LOG", "info")
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn worker");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let started = tokio::time::timeout(ratchet_tests::BOUND, async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if line.contains("worker started") {
                return true;
            }
        }
        false
    })
    .await
    .expect("started within the bound");
    assert!(started);
    let pid = child.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = tokio::time::timeout(ratchet_tests::BOUND, child.wait())
        .await
        .expect("stopped within the bound")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

/// Log lines carry no colour codes when stderr is not a terminal, nor with
/// `NO_COLOR`. Seen failing before the fix: every line started with
/// `\x1b[2m` (tracing's default is colour whatever the output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_carry_no_colour_codes_off_a_terminal() {
    let h = Harness::new().await;
    for no_color in [None, Some("1")] {
        let mut cmd = ratchet(BIN, &h.url);
        cmd.args(["worker", "--until-idle"])
            .env("RATCHET_LOG", "debug");
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let out = output(cmd).await;
        assert!(out.status.success(), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.is_empty(), "debug logging wrote lines");
        assert!(!stderr.contains('\u{1b}'), "{stderr}");
    }
}

/// `ratchet audit --run RUN` audits that run alone; an unknown run is bad
/// input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_checks_one_run_when_asked() {
    let h = Harness::new().await;
    h.register(&ratchet_tests::DEMO_PLUGINS).await;
    let run = h.submit_demo().await;
    h.submit_demo().await;
    h.run_until_idle(2).await;
    let out = cli(&h.url, &["audit", "--run", &run, "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(
        (report["runs"].as_u64(), report["jobs"].as_u64()),
        (Some(1), Some(4))
    );
    let out = cli(&h.url, &["audit"]).await;
    assert!(stdout(&out).contains("audited 2 runs, 8 jobs"), "{out:?}");
    assert_bad_input(
        &cli(&h.url, &["audit", "--run", "no-such-run"]).await,
        "does not exist",
    );
}

/// An operator cancels a run and retries it from the command line; every
/// refusal is one line with exit code 2 and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_retry_from_the_command_line() {
    let h = Harness::new().await;
    let url = h.url.as_str();
    h.register(&["noop"]).await;
    let run = h
        .submit(&ratchet_tests::one_stage_pipeline("a", "noop", ""), b"")
        .await;

    assert_bad_input(&cli(url, &["retry", &run]).await, "cancel it first");
    assert_bad_input(&cli(url, &["cancel", "nope"]).await, "no run `nope`");
    let cancelled = cli(
        url,
        &[
            "cancel",
            &run,
            "--reason",
            "wrong input",
            "--by",
            "alice",
            "--json",
        ],
    )
    .await;
    assert!(cancelled.status.success(), "{cancelled:?}");
    let doc: serde_json::Value = serde_json::from_slice(&cancelled.stdout).expect("json");
    assert_eq!(
        (&doc["state"], &doc["in_flight"], &doc["waiting"]),
        (&"cancelled".into(), &0.into(), &1.into())
    );
    assert_bad_input(&cli(url, &["cancel", &run]).await, "already cancelled");
    assert_bad_input(
        &cli(url, &["retry", &run, "--stage", "nope"]).await,
        "has no stage `nope`",
    );
    assert_eq!(
        h.run_state(&run).await,
        "cancelled",
        "refusals changed nothing"
    );

    let retried = cli(url, &["retry", &run, "--by", "bob"]).await;
    assert!(retried.status.success(), "{retried:?}");
    assert!(stdout(&retried).contains("generation 2"), "{retried:?}");
    let worked = cli(url, &["worker", "--until-idle"]).await;
    assert!(worked.status.success(), "{worked:?}");
    let shown = stdout(&cli(url, &["status", &run]).await);
    assert!(shown.contains(": succeeded"), "{shown}");
    assert!(
        shown.contains("history: cancelled by alice: wrong input")
            && shown.contains("history: retried by bob as generation 2: a resumed"),
        "{shown}"
    );
}

/// An approval gate decided from the command line: `status` shows what it
/// asks, `approve` records who and why, a second decision is told which
/// won, and deciding a plugin stage is bad input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_and_reject_from_the_command_line() {
    let h = Harness::new().await;
    let url = h.url.as_str();
    h.register(&["noop"]).await;
    let pipeline = "name = \"gated\"\n[[stage]]\nname = \"a\"\nplugin = \"noop@^1\"\n\
                    [[stage]]\nname = \"ok\"\napprove = \"Ship it?\"\nafter = [\"a\"]\n";
    let run = h.submit(pipeline, b"").await;
    assert_bad_input(&cli(url, &["approve", &run, "ok"]).await, "not awaiting");
    h.run_until_idle(1).await;
    let shown = stdout(&cli(url, &["status", &run]).await);
    assert!(shown.contains("awaits a decision: Ship it?"), "{shown}");
    assert_bad_input(&cli(url, &["reject", &run, "a"]).await, "runs a plugin");

    let args = [
        "approve", &run, "ok", "--by", "alice", "--note", "fine", "--json",
    ];
    let approved = cli(url, &args).await;
    assert!(approved.status.success(), "{approved:?}");
    let doc: serde_json::Value = serde_json::from_slice(&approved.stdout).expect("json");
    assert_eq!(
        (&doc["decision"]["decision"], &doc["decision"]["by"]),
        (&"approved".into(), &"alice".into())
    );
    assert_bad_input(
        &cli(url, &["reject", &run, "ok", "--by", "bob"]).await,
        "already approved by alice (fine)",
    );
    assert_eq!(h.run_state(&run).await, "succeeded");
}

/// What a program reads: each command that reports something prints one
/// JSON document with `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_answer_programs_in_json() {
    let h = Harness::new().await;
    let url = h.url.as_str();
    let json = |o: Output| -> serde_json::Value {
        assert!(o.status.success(), "{o:?}");
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"))
    };
    for name in DEMO_PLUGINS {
        let path = plugin_path(name).display().to_string();
        let added = json(cli(url, &["plugin", "add", &path, "--json"]).await);
        assert_eq!(
            (&added["name"], &added["registered"]),
            (&name.into(), &true.into())
        );
    }
    let path = plugin_path("draft").display().to_string();
    let again = json(cli(url, &["plugin", "add", &path, "--json"]).await);
    assert_eq!(again["registered"], false);
    let listed = json(cli(url, &["plugin", "list", "--json"]).await);
    assert_eq!(listed.as_array().map(Vec::len), Some(4), "{listed}");

    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/demo.toml");
    let keyed = ["run", demo, "--idempotency-key", "k", "--json"];
    let submitted = json(cli(url, &keyed).await);
    assert_eq!(submitted["created"], true);
    let run = submitted["run_id"].as_str().expect("run id").to_string();
    let resubmitted = json(cli(url, &keyed).await);
    assert_eq!(
        (&resubmitted["run_id"], &resubmitted["created"]),
        (&run.as_str().into(), &false.into())
    );
    let shown = json(cli(url, &["plugin", "show", "draft", "--json"]).await);
    assert_eq!(shown[0]["runs_using_it"], 1, "{shown}");
    assert_eq!(shown[0]["plugin"]["contract"], "0.2.0", "{shown}");
    let text = cli(url, &["plugin", "show", "draft"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("contract:      ratchet:stage@0.2.0"),
        "{text}"
    );

    assert!(cli(url, &["worker", "--until-idle"]).await.status.success());
    let artifacts = json(cli(url, &["artifacts", &run, "--json"]).await);
    assert_eq!(artifacts.as_array().map(Vec::len), Some(5), "{artifacts}");
    let draft = json(cli(url, &["artifacts", &run, "draft.draft", "--json"]).await);
    let text = draft["text"].as_str().expect("the draft is text");
    assert_eq!(
        draft["artifact"]["digest"].as_str(),
        Some(sha256_hex(text.as_bytes()).as_str())
    );
    let yanked = json(cli(url, &["plugin", "yank", "draft@1.0.0", "--json"]).await);
    assert_eq!(yanked["yanked"], true);
}
