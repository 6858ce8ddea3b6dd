//! The dashboard in a real browser: Debian's headless Chromium, driven
//! through chromedriver over WebDriver (fantoccini), against a real
//! `ratchet serve` on 127.0.0.1 (docs/dashboard.md). Each test saves a
//! screenshot under `target/tmp/dashboard/`.
//!
//! chromedriver is found at `RATCHET_TEST_CHROMEDRIVER` (`/usr/bin/chromedriver`
//! by default; `off` skips); under `CI=true` a missing one fails.
//!
//! Seen failing:
//! - with a reader's input matched to an artifact by stage alone, not
//!   stage and output, each map element's read of its own paragraph
//!   (`split.parts[i]`) was compared with the whole list (`split.parts`)
//!   and marked `✗ not canonical`;
//! - with the page not reading the run again on its event stream (only
//!   after its own actions), the approved run never showed `succeeded`;
//! - with a map's elements drawn whether or not it was unfolded, the
//!   `summarise` elements were on the page before the click;
//! - with the layers' heights summed instead of the tallest taken, the
//!   1,000-stage graph was 64,022 pixels tall, ten times its tallest column.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use ratchet_runtime::store::{JobState, Verdict};
use ratchet_tests::serve::{Served, TOKEN};
use ratchet_tests::{BOUND, Harness, output, ratchet};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

/// Submits a run through the API and returns its id.
async fn submit(api: &Served, pipeline: &str, input: &str) -> String {
    let response = api
        .post("/runs")
        .json(&json!({ "pipeline": pipeline, "input": input }))
        .send()
        .await
        .expect("POST /runs");
    assert!(response.status().is_success(), "{response:?}");
    let submitted: Value = response.json().await.expect("a submitted run");
    submitted["run_id"].as_str().expect("run id").to_string()
}

/// chromedriver's path, or `None` (with a note) where there is none and
/// this is not CI.
fn chromedriver() -> Option<String> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let path = std::env::var("RATCHET_TEST_CHROMEDRIVER")
        .unwrap_or_else(|_| "/usr/bin/chromedriver".to_string());
    if path != "off" && std::path::Path::new(&path).exists() {
        return Some(path);
    }
    assert!(
        !ci,
        "CI=true needs chromedriver at RATCHET_TEST_CHROMEDRIVER (now `{path}`); .ci/run installs Debian's chromium-driver"
    );
    eprintln!("skipping the dashboard's browser tests: no chromedriver at `{path}`");
    None
}

fn is_stale(e: &fantoccini::error::CmdError) -> bool {
    matches!(e, fantoccini::error::CmdError::Standard(w) if w.error == fantoccini::error::ErrorStatus::StaleElementReference)
}

/// A headless Chromium and the chromedriver that drives it.
struct Browser {
    _driver: tokio::process::Child,
    client: Client,
    base: String,
}

impl Browser {
    /// A browser signed in to `api` with its token, on the runs list.
    async fn signed_in(driver: &str, api: &Served) -> Self {
        let browser = Self::open(driver, api).await;
        browser.sign_in().await;
        browser
    }

    async fn open(driver: &str, api: &Served) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = tokio::process::Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn chromedriver");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        tokio::time::timeout(BOUND, async {
            while let Some(line) = lines.next_line().await.expect("chromedriver's output") {
                if line.contains("started successfully") {
                    return;
                }
            }
            panic!("chromedriver ended before it started");
        })
        .await
        .expect("chromedriver started within the bound");
        let mut caps = serde_json::Map::new();
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1440,1000",
        ];
        caps.insert("goog:chromeOptions".into(), json!({ "args": args }));
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session");
        Self {
            _driver: child,
            client,
            base: api.base.clone(),
        }
    }

    async fn goto(&self, path: &str) {
        let url = format!("{}{path}", self.base);
        self.client.goto(&url).await.expect("navigate");
    }

    /// The first element matching `css`, waiting for it within the bound.
    async fn wait(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(BOUND)
            .every(Duration::from_millis(50))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no `{css}` within the bound: {e}"))
    }

    /// Clicks the first element matching `css`, finding it again if the
    /// page redrew it between the finding and the click.
    async fn click(&self, css: &str) {
        tokio::time::timeout(BOUND, async {
            loop {
                match self.wait(css).await.click().await {
                    Ok(()) => return,
                    Err(e) if is_stale(&e) => continue,
                    Err(e) => panic!("click `{css}`: {e}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("`{css}` kept being redrawn"));
    }

    async fn all(&self, css: &str) -> Vec<Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .expect("find elements")
    }

    async fn attr(&self, css: &str, name: &str) -> Option<String> {
        let element = self.wait(css).await;
        element.attr(name).await.expect("read an attribute")
    }

    /// Signs in with the server's token through the form it asks with.
    async fn sign_in(&self) {
        self.goto("/").await;
        let field = self.wait("#login[open] #token").await;
        field.send_keys(TOKEN).await.expect("type the token");
        self.click("#login button[type=submit]").await;
    }

    async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .expect("run a script")
    }

    /// Saves what the browser shows as `target/tmp/dashboard/NAME.png`.
    async fn screenshot(&self, name: &str) {
        self.js("window.scrollTo(0, 0); return true").await;
        let png = self.client.screenshot().await.expect("a screenshot");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
        std::fs::create_dir_all(&dir).expect("screenshot folder");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("save the screenshot");
    }

    async fn close(self) {
        self.client.close().await.expect("end the session");
    }
}

/// The demo's run went through a real worker crash. Its page draws every
/// stage; the draft's attempt 1 ended with the lease lapsed on the worker
/// that died, attempt 2 succeeded, and the model's answer was asked by
/// attempt 1 and replayed to attempt 2; every read of every artifact is
/// marked canonical, none not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_demo_run_shows_its_graph_its_replay_and_canonical_reads() {
    let Some(driver) = chromedriver() else {
        return;
    };
    let h = Harness::new().await;
    let mut demo = ratchet(BIN, &h.url);
    demo.args(["demo", "--runs", "1"]);
    let out = output(demo).await;
    assert!(out.status.success(), "{out:?}");
    let run = h.store.run_list().await.expect("runs")[0].id.clone();
    let api = Served::start(BIN, &h.url).await;
    let b = Browser::signed_in(&driver, &api).await;

    // The runs list links to it.
    b.wait(&format!("tr[data-run='{run}']")).await;
    b.screenshot("runs-list").await;
    // Filtered to failed runs, it has none; searched by the id, this one.
    b.wait("select[name=state] option[value=failed]")
        .await
        .click()
        .await
        .expect("choose failed");
    b.click("form.filters button[type=submit]").await;
    b.wait("main p.empty").await;
    b.wait("select[name=state] option[value='']")
        .await
        .click()
        .await
        .expect("choose any");
    b.wait("input[name=q]")
        .await
        .send_keys(&run)
        .await
        .expect("type the id");
    b.click("form.filters button[type=submit]").await;
    b.wait(&format!("tr[data-run='{run}']")).await;
    let url = b.client.current_url().await.expect("the URL");
    assert_eq!(url.query(), Some(format!("q={run}").as_str()));
    b.click(&format!("tr[data-run='{run}'] a")).await;
    b.wait("[data-run-state='succeeded']").await;

    let jobs = h.store.job_list(&run).await.expect("jobs");
    for job in &jobs {
        b.wait(&format!("g.node[data-stage='{}']", job.stage)).await;
    }
    assert_eq!(b.all("g.node").await.len(), jobs.len());

    b.click("g.node[data-stage='draft']").await;
    let first = ".panel.stage[data-stage='draft'] li.attempt[data-attempt='1']";
    assert_eq!(
        b.attr(first, "data-outcome").await.as_deref(),
        Some("lease_expired")
    );
    let worker = b.wait(&format!("{first} .worker")).await.text().await;
    assert_eq!(worker.expect("worker"), "demo-doomed-worker");
    let second = ".panel.stage[data-stage='draft'] li.attempt[data-attempt='2']";
    assert_eq!(
        b.attr(second, "data-outcome").await.as_deref(),
        Some("succeeded")
    );
    let call = ".panel.stage[data-stage='draft'] .journal li";
    assert_eq!(b.attr(call, "data-asked-by").await.as_deref(), Some("1"));
    assert_eq!(
        b.attr(call, "data-replayed-to").await.as_deref(),
        Some("#2")
    );
    let journal = h.store.model_call_list(&run).await.expect("journal");
    let draft = journal
        .iter()
        .find(|c| c.stage == "draft")
        .expect("draft's");
    let usage = draft.usage.expect("the built-in backend counts tokens");
    let tokens = format!("{}+{}", usage.prompt_tokens, usage.completion_tokens);
    assert_eq!(
        b.attr(call, "data-tokens").await,
        Some(tokens),
        "the call's tokens shown"
    );
    assert_eq!(
        (
            b.attr(call, "data-model").await,
            b.attr(call, "data-finish").await
        ),
        (Some("stochastic".into()), Some("stop".into())),
        "the model that answered and why its answer ended"
    );

    // Every succeeded attempt's read of a stored artifact is marked as the
    // canonical digest, and no read is marked otherwise.
    let artifacts = h.store.artifact_list(&run).await.expect("artifacts");
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    let graph = h.store.run_graph(&run).await.expect("graph");
    let mut reads = 0;
    for input in &graph.inputs {
        let stored = artifacts
            .iter()
            .any(|a| a.stage == input.from_stage && a.output == input.from_output);
        let read_by = attempts.iter().filter(|a| {
            a.stage == input.stage
                && a.input_digests
                    .as_ref()
                    .is_some_and(|d| d.contains_key(&input.input))
        });
        for attempt in read_by.filter(|_| stored) {
            let mark = format!(
                "[data-reader='{}.{}#{}']",
                input.stage, input.input, attempt.attempt
            );
            let class = b.attr(&mark, "class").await;
            assert_eq!(class.as_deref(), Some("canonical-ok"), "{mark}");
            reads += 1;
        }
    }
    assert!(reads >= 3, "the demo's stages read {reads} artifacts");
    assert!(b.all(".canonical-differs").await.is_empty());

    // The draft's bytes, viewed from the provenance table, are the stored
    // ones, and can be downloaded.
    let provenance = "section[aria-labelledby='provenance-title']";
    b.click(&format!(
        "{provenance} tr[data-artifact='draft.draft'] button"
    ))
    .await;
    let shown = b
        .wait(&format!("{provenance} tr.viewer-row pre.content"))
        .await;
    let stored = h.store.artifact_get(&run, "draft", "draft").await;
    let stored = stored.expect("read the draft").expect("a draft");
    let text = String::from_utf8(stored.bytes).expect("the draft is text");
    assert_eq!(
        shown.text().await.expect("the shown bytes"),
        text.trim_end()
    );
    let download = b
        .attr(
            &format!("{provenance} tr.viewer-row a[download]"),
            "download",
        )
        .await;
    assert_eq!(download.as_deref(), Some("draft.draft"));
    b.screenshot("crashed-demo-run").await;
    b.close().await;
}

/// The map-reduce pipeline with a worker running beside the page: the
/// map shows its elements' counts and unfolds them on a click; the gate
/// is approved by clicking (and confirming), and the page shows the run
/// succeed without reloading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_a_gate_by_clicking_finishes_the_run_without_a_reload() {
    let Some(driver) = chromedriver() else {
        return;
    };
    let paragraphs = ["One paragraph.", "Two paragraphs.", "Three."];
    // Every field bound: the server and the worker live to the end.
    let MapReduce {
        h,
        _api,
        _worker,
        run,
        b,
    } = MapReduce::at_its_gate(&driver, &paragraphs).await;
    let map = "g.node[data-stage='summarise'][data-kind='map']";
    let title = b.wait(&format!("{map} text.sub")).await.text().await;
    assert_eq!(title.expect("map counts"), "map of 3 · 3 succeeded");
    assert!(b.all("g.node[data-kind='element']").await.is_empty());
    b.click("g.toggle[aria-label^='Show the 3 elements']").await;
    b.wait("g.node[data-stage='summarise[2]'][data-kind='element']")
        .await;
    assert_eq!(b.all("g.node[data-kind='element']").await.len(), 3);
    // The map's panel lists its elements; one is chosen from there.
    b.click(map).await;
    b.click(".panel.stage[data-stage='summarise'] .elements button:nth-of-type(2)")
        .await;
    b.wait(".panel.stage[data-stage='summarise[1]'] li.attempt[data-outcome='succeeded']")
        .await;

    b.js("window.kept = 'the same page'; return true").await;
    b.click("g.node[data-stage='review']").await;
    b.click("button[data-action='approve']").await;
    b.click("#confirm[open] [data-answer='yes']").await;
    b.wait("[data-run-state='succeeded']").await;
    assert_eq!(
        b.js("return window.kept ?? null").await,
        json!("the same page"),
        "the page was reloaded"
    );
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let review = jobs.iter().find(|j| j.stage == "review").expect("review");
    assert_eq!(review.state, JobState::Succeeded);
    let decision = h
        .store
        .artifact_get(&run, "review", "decision")
        .await
        .expect("read the decision")
        .expect("a decision");
    let decision: ratchet_runtime::store::Decision =
        serde_json::from_slice(&decision.bytes).expect("a decision document");
    assert_eq!(
        (decision.decision, decision.by.as_str()),
        (Verdict::Approved, "dashboard")
    );
    // Each element read its own paragraph, the canonical one.
    for i in 0..3 {
        let mark = format!("[data-reader='summarise[{i}].part#1']");
        assert_eq!(
            b.attr(&mark, "class").await.as_deref(),
            Some("canonical-ok")
        );
    }
    assert!(b.all(".canonical-differs").await.is_empty());
    b.screenshot("approved-map-reduce-run").await;
    b.close().await;
}

/// A run of 1,000 stages (ten layers of 100, each stage after one of the
/// layer before) loads, draws every stage in ten columns, and counts
/// them: 100 ready, 900 blocked. Then it is cancelled from the page.
/// Seen failing with the run's history not drawn: the wait for its cancel
/// timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_stage_run_loads_with_its_counts() {
    let Some(driver) = chromedriver() else {
        return;
    };
    let h = Harness::new().await;
    h.register(&["noop"]).await;
    let api = Served::start(BIN, &h.url).await;
    let mut pipeline = String::from("name = \"thousand\"\n");
    for i in 0..1000 {
        pipeline.push_str(&format!(
            "[[stage]]\nname = \"s{i:04}\"\nplugin = \"noop@^1\"\n"
        ));
        if i >= 100 {
            pipeline.push_str(&format!("after = [\"s{:04}\"]\n", i - 100));
        }
    }
    let run = submit(&api, &pipeline, "").await;

    let b = Browser::signed_in(&driver, &api).await;
    b.goto(&format!("/runs/{run}")).await;
    b.wait("[data-stages='1000']").await;
    let ready = b.wait("[data-count='ready']").await.text().await;
    assert_eq!(ready.expect("ready count"), "100 ready");
    let blocked = b.wait("[data-count='blocked']").await.text().await;
    assert_eq!(blocked.expect("blocked count"), "900 blocked");
    assert_eq!(b.all("g.node").await.len(), 1000);
    // Ten columns of 100: as tall as one column, not as all of them.
    let size = b
        .js("const g = document.querySelector('svg.graph'); return [g.width.baseVal.value, g.height.baseVal.value]")
        .await;
    let (width, height) = (
        size[0].as_f64().expect("width"),
        size[1].as_f64().expect("height"),
    );
    assert!(
        height < 100.0 * 80.0 && width < 10.0 * 300.0,
        "the graph is {width}×{height}"
    );
    b.screenshot("thousand-stage-run").await;

    // Cancelled by clicking (and confirming): the page shows the run
    // cancelled and the cancel in its history.
    b.click("button[data-action='cancel']").await;
    b.click("#confirm[open] [data-answer='yes']").await;
    b.wait("[data-run-state='cancelled']").await;
    let entry = b.wait(".run-head .history li[data-kind='cancel']").await;
    let entry = entry.text().await.expect("the history's entry");
    assert!(entry.contains("dashboard"), "{entry}");
    assert_eq!(h.run_state(&run).await, "cancelled");
    b.close().await;
}

/// A map of more elements than the graph draws one by one (80, over the
/// 60 it unfolds) shows only its counts, with no control to unfold it;
/// its panel still lists every element. Seen failing with the limit
/// unchecked: the 80 elements had a **+** like a small map's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_map_is_drawn_as_its_counts() {
    let Some(driver) = chromedriver() else {
        return;
    };
    let paragraphs: Vec<String> = (0..80).map(|i| format!("Paragraph {i}.")).collect();
    let MapReduce {
        h: _h,
        _api,
        _worker,
        run: _,
        b,
    } = MapReduce::at_its_gate(&driver, &paragraphs).await;
    let map = "g.node[data-stage='summarise'][data-kind='map']";
    let title = b.wait(&format!("{map} text.sub")).await.text().await;
    assert_eq!(title.expect("map counts"), "map of 80 · 80 succeeded");
    assert!(b.all("g.toggle").await.is_empty(), "a large map unfolds");
    assert!(b.all("g.node[data-kind='element']").await.is_empty());
    let size = b.wait("p.size").await.text().await.expect("the run's size");
    assert!(
        size.starts_with("85 stages (80 of them map elements):"),
        "{size}"
    );
    b.click(map).await;
    let listed = b
        .all(".panel.stage[data-stage='summarise'] .elements button")
        .await;
    assert_eq!(listed.len(), 80);
    b.screenshot("large-map").await;
    b.close().await;
}

/// A map-reduce run (`plugins/map-reduce.toml`) of one element per
/// paragraph, worked on by a real worker beside the page, open in a
/// signed-in browser once its gate awaits a decision. A browser opening
/// the run's URL gets the page, not the JSON.
struct MapReduce {
    h: Harness,
    _api: Served,
    _worker: tokio::process::Child,
    run: String,
    b: Browser,
}

impl MapReduce {
    async fn at_its_gate(driver: &str, paragraphs: &[impl AsRef<str>]) -> Self {
        let h = Harness::new().await;
        h.register(&["split", "summarise", "join", "publish"]).await;
        let api = Served::start(BIN, &h.url).await;
        let pipeline = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/map-reduce.toml"),
        )
        .expect("the map-reduce pipeline");
        let text: Vec<&str> = paragraphs.iter().map(AsRef::as_ref).collect();
        let run = submit(&api, &pipeline, &text.join("\n\n")).await;
        let mut worker = ratchet(BIN, &h.url);
        worker.args(["worker", "--worker-id", "beside-the-page"]);
        let worker = worker.spawn().expect("spawn a worker");
        let b = Browser::signed_in(driver, &api).await;
        b.goto(&format!("/runs/{run}")).await;
        b.wait("g.node[data-stage='review'][data-state='awaiting']")
            .await;
        Self {
            h,
            _api: api,
            _worker: worker,
            run,
            b,
        }
    }
}

/// An action the server refuses shows the server's own reason: the gate
/// is rejected through the API while the operator's confirmation dialog
/// for approving it is open, so the approval comes second and is refused.
/// A run that does not exist gets the server's reason too, not a page
/// left loading (seen failing so before the 404 was told).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_action_shows_the_servers_reason() {
    let Some(driver) = chromedriver() else {
        return;
    };
    let h = Harness::new().await;
    h.register(&["noop"]).await;
    let api = Served::start(BIN, &h.url).await;
    let pipeline = "name = \"asks-first\"\n[[stage]]\nname = \"review\"\napprove = \"Go ahead?\"\n[[stage]]\nname = \"b\"\nplugin = \"noop@^1\"\nafter = [\"review\"]\n";
    let run = submit(&api, pipeline, "").await;

    let b = Browser::signed_in(&driver, &api).await;
    b.goto(&format!("/runs/{run}")).await;
    b.click("g.node[data-stage='review'][data-state='awaiting']")
        .await;
    b.click("button[data-action='approve']").await;
    let confirm = b.wait("#confirm[open] [data-answer='yes']").await;
    let rejected = api
        .post(&format!("/runs/{run}/stages/review/reject"))
        .json(&json!({ "by": "someone-else" }))
        .send()
        .await
        .expect("reject through the API");
    assert!(rejected.status().is_success(), "{rejected:?}");
    confirm.click().await.expect("confirm");

    let again = api
        .post(&format!("/runs/{run}/stages/review/approve"))
        .json(&json!({}))
        .send()
        .await
        .expect("approve through the API");
    assert_eq!(again.status(), reqwest::StatusCode::CONFLICT);
    let problem: Value = again.json().await.expect("a problem document");
    let toast = b.wait("#toast.error:not([hidden])").await.text().await;
    assert_eq!(
        toast.expect("the message"),
        problem["detail"].as_str().expect("detail")
    );
    b.wait("[data-run-state='failed']").await;
    b.screenshot("refused-approval").await;

    // A run that does not exist is said so, with the server's words.
    b.goto("/runs/no-such-run").await;
    let said = b
        .wait("main .panel p")
        .await
        .text()
        .await
        .expect("the reason");
    assert!(said.contains("no-such-run"), "{said}");
    b.close().await;
}
