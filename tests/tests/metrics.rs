//! `/metrics` of a real `ratchet worker --metrics-listen` process after a
//! known workload (a demo run, one run whose stage fails fatally, the
//! attempts of a worker killed mid-attempt taken over, and a demo run
//! submitted after that worker died), on both
//! backends: every counter equals what the store says happened, model
//! tokens included.
//!
//! Seen failing with every failed attempt labelled `retrying`: the dead
//! attempt of `always-fatal` was missing from `outcome="dead"`; and with
//! PostgreSQL's claim statement saying no job was taken over: the
//! takeovers counted 0 where the store recorded `lease_expired` attempts.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ratchet_runtime::client::Client;
use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::crash::CRASH_EXIT_CODE;
use ratchet_runtime::store::RunState;
use ratchet_tests::{
    BOUND, Backend, DEMO_PLUGINS, Harness, one_stage_pipeline, output, ratchet,
    shared_component_cache,
};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

ratchet_tests::backend_tests! {
    the_counters_equal_what_the_store_says => counters_match_the_store;
}

/// `name{labels}` (labels as printed) to value, of the exposition text.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn sample(all: &BTreeMap<String, f64>, key: &str) -> f64 {
    all.get(key).copied().unwrap_or(0.0)
}

async fn counters_match_the_store(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    h.register(&["always-fatal"]).await;
    let mut runs = vec![h.submit_demo().await];
    let fatal = one_stage_pipeline("doomed", "always-fatal", "");
    runs.push(h.submit(&fatal, b"").await);

    // A worker that dies after executing its first attempts: their jobs
    // are taken over when their leases expire.
    let mut doomed = ratchet(BIN, &h.url);
    doomed
        .args(["worker", "--until-idle", "--lease-ms", "300"])
        .env("FAILPOINTS", "after_execute=return(exit)");
    let out = output(doomed).await;
    assert_eq!(out.status.code(), Some(CRASH_EXIT_CODE), "{out:?}");
    // Submitted once that worker is dead, so that the worker below makes a
    // model call of its own. With both demo runs submitted before, the
    // dead worker's concurrent drafts sometimes both journaled their calls
    // before it exited, and every call made below was a replay (seen in a
    // full `cargo test --workspace` on PostgreSQL: "tokens were used").
    runs.push(h.submit_demo().await);

    let mut worker = ratchet(BIN, &h.url);
    worker
        .args(["worker", "--metrics-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped());
    let mut child = worker.spawn().expect("spawn the worker");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::time::timeout(BOUND, BufReader::new(stdout).lines().next_line()).await;
    let line = line
        .expect("the address within the bound")
        .expect("read")
        .expect("a line");
    let url = line
        .strip_prefix("metrics on ")
        .expect("the metrics line")
        .to_string();

    let client = Client::builder(h.url.clone())
        .cache_dir(shared_component_cache())
        .poll(Duration::from_millis(20))
        .open()
        .await
        .expect("client");
    for run in &runs {
        let finished = client.wait(run, BOUND).await.expect("the run finished");
        assert_ne!(finished.state, RunState::Running);
    }
    let text = reqwest::get(&url)
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    let got = samples(&text);

    // What the store says happened, by plugin name.
    let names: BTreeMap<String, String> = (h.store.plugin_list().await.expect("plugins"))
        .into_iter()
        .map(|p| (p.digest, p.name))
        .collect();
    let mut expected: BTreeMap<(String, String), f64> = BTreeMap::new();
    let (mut succeeded, mut taken_over) = (0.0, 0.0);
    // Model calls journaled by this worker's attempts, and by the dead
    // worker's (this worker's attempts replayed them).
    let (mut fresh, mut replayed) = (0.0, 0.0);
    // The tokens of this worker's answers, as the journal has them.
    let (mut prompt, mut completion) = (0.0, 0.0);
    for run in &runs {
        let mut dead_workers = BTreeSet::new();
        for a in h.store.attempt_list(run).await.expect("attempts") {
            let plugin = names[a.plugin_digest.as_deref().expect("a plugin stage")].clone();
            let outcome = match a.outcome.as_str() {
                // The dead worker's, counted by none.
                "lease_expired" => {
                    taken_over += 1.0;
                    dead_workers.insert((a.stage, a.attempt));
                    continue;
                }
                "succeeded" => "succeeded",
                "failed" if a.error.as_deref().is_some_and(|e| e.contains("fatal")) => "dead",
                "failed" => "retrying",
                other => panic!("unexpected outcome {other}"),
            };
            succeeded += f64::from(u8::from(outcome == "succeeded"));
            *expected.entry((plugin, outcome.to_string())).or_default() += 1.0;
        }
        for call in h.store.model_call_list(run).await.expect("journal") {
            if dead_workers.contains(&(call.stage, call.attempt)) {
                replayed += 1.0;
                continue;
            }
            fresh += 1.0;
            let usage = call.usage.expect("the built-in backend counts tokens");
            prompt += f64::from(usage.prompt_tokens);
            completion += f64::from(usage.completion_tokens);
        }
    }
    for ((plugin, outcome), n) in &expected {
        let key = format!("ratchet_attempts_total{{plugin=\"{plugin}\",outcome=\"{outcome}\"}}");
        assert_eq!(sample(&got, &key), *n, "{key} in\n{text}");
        let count = format!(
            "ratchet_attempt_duration_seconds_count{{plugin=\"{plugin}\",outcome=\"{outcome}\"}}"
        );
        assert_eq!(sample(&got, &count), *n, "{count}");
    }
    let total: f64 = got
        .iter()
        .filter(|(k, _)| k.starts_with("ratchet_attempts_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        total,
        expected.values().sum::<f64>(),
        "no attempt counted twice"
    );
    assert!(expected.contains_key(&("always-fatal".into(), "dead".into())));
    assert!(prompt > 0.0 && completion > 0.0, "tokens were used");
    for (key, journaled) in [
        ("ratchet_model_calls_total{source=\"fresh\"}", fresh),
        ("ratchet_model_calls_total{source=\"replayed\"}", replayed),
        ("ratchet_model_tokens_total{kind=\"prompt\"}", prompt),
        (
            "ratchet_model_tokens_total{kind=\"completion\"}",
            completion,
        ),
    ] {
        assert_eq!(sample(&got, key), journaled, "{key}");
    }
    assert!(
        taken_over > 0.0,
        "the dead worker's attempts were taken over"
    );
    assert_eq!(
        sample(&got, "ratchet_lease_takeovers_total"),
        taken_over,
        "{text}"
    );
    assert_eq!(
        sample(&got, "ratchet_commit_batch_size_sum"),
        succeeded,
        "completions committed"
    );
    assert_eq!(sample(&got, "ratchet_jobs{state=\"ready\"}"), 0.0);
    assert_eq!(sample(&got, "ratchet_jobs{state=\"running\"}"), 0.0);
    assert_eq!(
        sample(&got, "ratchet_outbox_deliveries{state=\"pending\"}"),
        0.0
    );
    child.kill().await.expect("stop the worker");
}
