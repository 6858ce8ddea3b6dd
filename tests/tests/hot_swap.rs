//! Hot swap: new plugin versions are picked up by running workers, runs keep
//! the digests they were pinned to, and the registry refuses what would
//! break that (changed bytes under a version, incompatible upgrades).

use std::process::Output;
use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::store::PluginPut;
use ratchet_tests::fleet::Fleet;
use ratchet_tests::{Backend, DEMO_PLUGINS, Harness, output, plugin_path, ratchet};

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

ratchet_tests::backend_tests! {
    a_running_worker_runs_new_runs_on_a_version_registered_after_it_started => live_pick_up;
    a_retry_after_a_swap_keeps_the_pinned_version_and_its_canonical_artifact => retry_keeps_the_pin;
    a_yanked_version_is_not_resolved_for_new_runs_but_pinned_runs_complete => yank;
    upgrades_are_refused_or_accepted_as_the_run_allows => upgrades;
    a_submit_reads_only_the_manifests_it_resolves => submit_reads_what_it_resolves;
}

async fn cli(url: &str, args: &[&str]) -> Output {
    let mut cmd = ratchet(BIN, url);
    cmd.args(args);
    output(cmd).await
}

async fn add(url: &str, plugin: &str) -> Output {
    cli(
        url,
        &["plugin", "add", &plugin_path(plugin).display().to_string()],
    )
    .await
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn digest_of(h: &Harness, name: &str, version: &str) -> String {
    h.store
        .plugin_list()
        .await
        .expect("list")
        .into_iter()
        .find(|p| p.name == name && p.version == version)
        .unwrap_or_else(|| panic!("{name}@{version} registered"))
        .digest
}

async fn draft_of(h: &Harness, run: &str) -> (String, String) {
    let a = h
        .store
        .artifact_get(run, "draft", "draft")
        .await
        .expect("read")
        .expect("draft");
    (
        a.meta.plugin_digest.expect("produced by a plugin"),
        String::from_utf8(a.bytes).expect("text"),
    )
}

/// `draft@>=1` resolves to the newest registered version.
const ANY_DRAFT: &str = "draft@>=1";

fn pipeline_with(draft: &str) -> String {
    ratchet_runtime::bundled::DEMO_PIPELINE.replace("draft@^1", draft)
}

async fn live_pick_up(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    let mut fleet = Fleet::new(BIN, &h.url, &["--concurrency", "2"]);
    fleet.start(0);

    let before = h
        .submit(&pipeline_with(ANY_DRAFT), b"before the swap")
        .await;
    for _ in 0..4 {
        tokio::time::timeout(ratchet_tests::BOUND, fleet.progress.recv())
            .await
            .expect("progress");
    }
    let added = add(&h.url, "draft-v2").await;
    assert!(added.status.success(), "{added:?}");
    let after = h.submit(&pipeline_with(ANY_DRAFT), b"after the swap").await;
    for _ in 0..4 {
        tokio::time::timeout(ratchet_tests::BOUND, fleet.progress.recv())
            .await
            .expect("progress");
    }
    fleet.stop().await;

    let (v1, v2) = (
        digest_of(&h, "draft", "1.0.0").await,
        digest_of(&h, "draft", "2.0.0").await,
    );
    let (by, text) = draft_of(&h, &before).await;
    assert_eq!(by, v1, "the run submitted before the swap ran on 1.0.0");
    assert!(!text.starts_with("v2: "));
    let (by, text) = draft_of(&h, &after).await;
    assert_eq!(by, v2, "the same worker process ran the new run on 2.0.0");
    assert!(text.starts_with("v2: "), "{text}");
    let attempts = h.store.attempt_list(&after).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .find(|a| a.stage == "draft")
            .expect("draft")
            .plugin_digest,
        Some(v2)
    );
    h.assert_demo_run_converged(&before).await;
    h.assert_demo_run_converged(&after).await;
}

async fn retry_keeps_the_pin(backend: Backend) {
    for point in ["after_model_call", "after_commit"] {
        let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
            return;
        };
        h.register(&DEMO_PLUGINS).await;
        let run = h
            .submit(&pipeline_with(ANY_DRAFT), b"pinned to 1.0.0")
            .await;
        let mut doomed = ratchet(BIN, &h.url);
        doomed
            .args([
                "worker",
                "--until-idle",
                "--concurrency",
                "1",
                "--lease-ms",
                "300",
            ])
            .env("FAILPOINTS", format!("{point}=return(exit)"));
        assert!(
            !output(doomed).await.status.success(),
            "{point}: the worker died"
        );
        let committed_before_swap = h
            .store
            .artifact_get(&run, "draft", "draft")
            .await
            .expect("read");

        assert!(add(&h.url, "draft-v2").await.status.success());
        let survivor = cli(&h.url, &["worker", "--until-idle"]).await;
        assert!(survivor.status.success(), "{survivor:?}");

        let v1 = digest_of(&h, "draft", "1.0.0").await;
        let (by, text) = draft_of(&h, &run).await;
        assert_eq!(
            by, v1,
            "{point}: the retry ran the pinned 1.0.0, not the newer 2.0.0"
        );
        assert!(!text.starts_with("v2: "), "{point}: {text}");
        if let Some(before) = committed_before_swap {
            assert_eq!(
                before.bytes,
                text.as_bytes(),
                "{point}: the canonical draft was kept"
            );
        }
        let attempts = h.store.attempt_list(&run).await.expect("attempts");
        assert!(
            attempts
                .iter()
                .all(|a| a.stage != "draft" || a.plugin_digest.as_ref() == Some(&v1)),
            "{point}"
        );
        h.assert_demo_run_converged(&run).await;
    }
}

async fn yank(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    h.register(&["draft-v2"]).await;
    let pinned = h
        .submit(&pipeline_with(ANY_DRAFT), b"pinned to 2.0.0")
        .await;
    let yanked = cli(&h.url, &["plugin", "yank", "draft@2.0.0"]).await;
    assert!(yanked.status.success(), "{yanked:?}");

    let newer = h.submit(&pipeline_with(ANY_DRAFT), b"after the yank").await;
    let dir = tempfile::tempdir().expect("dir");
    let only_v2 = dir.path().join("v2.toml");
    std::fs::write(&only_v2, pipeline_with("draft@^2")).expect("write");
    let refused = cli(&h.url, &["run", &only_v2.display().to_string()]).await;
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        stderr(&refused).contains("no registered version of plugin `draft` matches `^2`"),
        "{}",
        stderr(&refused)
    );

    assert!(
        cli(&h.url, &["worker", "--until-idle"])
            .await
            .status
            .success()
    );
    let (v1, v2) = (
        digest_of(&h, "draft", "1.0.0").await,
        digest_of(&h, "draft", "2.0.0").await,
    );
    assert_eq!(
        draft_of(&h, &pinned).await.0,
        v2,
        "a pinned run keeps its yanked version"
    );
    assert_eq!(
        draft_of(&h, &newer).await.0,
        v1,
        "new runs resolve the highest non-yanked version"
    );
    h.assert_demo_run_converged(&pinned).await;
    h.assert_demo_run_converged(&newer).await;
    let shown = cli(&h.url, &["plugin", "show", "draft@2.0.0"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown.contains("(yanked)") && shown.contains("runs using it: 1"),
        "{shown}"
    );
}

async fn upgrades(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    h.register(&["draft-v2", "draft-incompatible"]).await;
    let waiting = h
        .submit(ratchet_runtime::bundled::DEMO_PIPELINE, b"upgrade me")
        .await;

    let refused = cli(
        &h.url,
        &["upgrade", &waiting, "--stage", "draft", "--to", "3.0.0"],
    )
    .await;
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        stderr(&refused).contains("not compatible"),
        "{}",
        stderr(&refused)
    );
    let refused = cli(
        &h.url,
        &["upgrade", &waiting, "--stage", "review", "--to", "2.0.0"],
    )
    .await;
    assert!(
        stderr(&refused).contains("has no stage `review`"),
        "{}",
        stderr(&refused)
    );

    let accepted = cli(
        &h.url,
        &[
            "upgrade", &waiting, "--stage", "draft", "--to", "2.0.0", "--json",
        ],
    )
    .await;
    assert!(accepted.status.success(), "{accepted:?}");
    let told: serde_json::Value = serde_json::from_slice(&accepted.stdout).expect("json");
    assert_eq!(
        (told["version"].as_str(), told["digest"].as_str()),
        (
            Some("2.0.0"),
            Some(digest_of(&h, "draft", "2.0.0").await.as_str())
        )
    );
    let history = h.store.run_events(&waiting).await.expect("history");
    assert_eq!(history.len(), 1);
    assert!(
        history[0].detail.contains("to draft@2.0.0"),
        "{:?}",
        history[0]
    );

    // Run only `draft`: the stage has succeeded, the run is still running.
    let sched = h.scheduler("worker", 30_000);
    let job = sched.claim(None).await.expect("claim").expect("draft");
    sched.run_claimed(job).await.expect("draft ran");
    let (by, text) = draft_of(&h, &waiting).await;
    assert_eq!(
        by,
        digest_of(&h, "draft", "2.0.0").await,
        "the upgraded stage ran 2.0.0"
    );
    assert!(text.starts_with("v2: "));
    let refused = cli(
        &h.url,
        &["upgrade", &waiting, "--stage", "draft", "--to", "1.0.0"],
    )
    .await;
    assert!(
        stderr(&refused).contains("stage `draft` is succeeded"),
        "{}",
        stderr(&refused)
    );

    assert!(
        cli(&h.url, &["worker", "--until-idle"])
            .await
            .status
            .success()
    );
    h.assert_demo_run_converged(&waiting).await;
    let refused = cli(
        &h.url,
        &["upgrade", &waiting, "--stage", "verify", "--to", "1.0.0"],
    )
    .await;
    assert!(
        stderr(&refused).contains("is succeeded; only running runs"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        h.store.run_events(&waiting).await.expect("history").len(),
        1,
        "refusals change nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_refuses_changed_bytes_and_components_that_are_not_stages() {
    let h = Harness::new().await;
    assert!(add(&h.url, "draft").await.status.success());

    let impostor = add(&h.url, "draft-impostor").await;
    assert_eq!(impostor.status.code(), Some(2), "{impostor:?}");
    assert!(
        stderr(&impostor).contains("`draft@1.0.0` is already registered with digest"),
        "{}",
        stderr(&impostor)
    );

    let not_a_stage = add(&h.url, "not-a-stage").await;
    assert_eq!(not_a_stage.status.code(), Some(2), "{not_a_stage:?}");
    assert!(
        stderr(&not_a_stage).contains("does not implement Ratchet's `stage` world"),
        "{}",
        stderr(&not_a_stage)
    );

    let dir = tempfile::tempdir().expect("dir");
    let corrupt = dir.path().join("corrupt.wasm");
    let bytes = std::fs::read(plugin_path("verify")).expect("component");
    std::fs::write(&corrupt, &bytes[..bytes.len() / 2]).expect("write");
    let corrupt = cli(&h.url, &["plugin", "add", &corrupt.display().to_string()]).await;
    assert_eq!(corrupt.status.code(), Some(2), "{corrupt:?}");
    assert!(
        stderr(&corrupt).contains("not a valid Wasm component"),
        "{}",
        stderr(&corrupt)
    );

    let listed = h.store.plugin_list().await.expect("list");
    assert_eq!(listed.len(), 1, "only the real draft is stored: {listed:?}");
}

/// Item 12 of #20: submitting resolves the pipeline's plugins without
/// loading and parsing every registered manifest. 200 older versions of
/// `draft` and 200 versions of an unrelated plugin are registered with
/// manifests that do not parse (stand-ins written to the store directly):
/// a submit that read them would fail. Seen failing before the fix: the
/// submit parsed every registered manifest and stopped at the first.
async fn submit_reads_what_it_resolves(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&DEMO_PLUGINS).await;
    for i in 0..200 {
        for (name, version) in [
            ("draft", format!("0.{i}.0")),
            ("unrelated", format!("1.{i}.0")),
        ] {
            h.store
                .plugin_put(PluginPut {
                    digest: format!("{name}-{i}"),
                    name: name.into(),
                    version,
                    manifest: "not a manifest".into(),
                    component: vec![0],
                    contract: "0.2.0".into(),
                    now: 0,
                })
                .await
                .expect("stand-in version");
        }
    }
    let run = h.submit_demo().await;
    let jobs = h.store.job_list(&run).await.expect("jobs");
    let draft = jobs.iter().find(|j| j.stage == "draft").expect("draft");
    assert!(
        !draft
            .plugin_digest
            .as_deref()
            .unwrap_or_default()
            .starts_with("draft-"),
        "pinned to 1.0.0"
    );
}
