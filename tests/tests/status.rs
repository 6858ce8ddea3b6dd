//! What `ratchet status` and `ratchet reconcile` tell a person (a table or
//! a sentence, times in the local time zone) and a program (`--json`,
//! times in RFC 3339).

use jiff::Timestamp;
use ratchet_tests::{Harness, output, ratchet};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ratchet-under-test");

/// A time zone far from UTC, with a half-hour offset, so a table in UTC or
/// in whole hours cannot pass for local time.
const ZONE: &str = "Asia/Kolkata";

async fn cli(url: &str, args: &[&str]) -> String {
    let mut cmd = ratchet(BIN, url);
    cmd.args(args).env("TZ", ZONE);
    let out = output(cmd).await;
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An RFC 3339 time of `--json`, as the table shows it in [`ZONE`].
fn local(rfc3339: &Value) -> String {
    let at: Timestamp = rfc3339
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not RFC 3339: {rfc3339}"));
    let zoned = at.in_tz(ZONE).expect("the zone is known");
    zoned.strftime("%Y-%m-%d %H:%M:%S %:z").to_string()
}

/// The demo's run went through a real worker crash: `status RUN` lists each
/// stage's attempts (worker, start, how long, outcome, error, whether its
/// proposal won), the draft's first one lapsed on the worker that died, the
/// second won; the table's times are local and `--json`'s RFC 3339. Seen
/// failing before the attempts were listed (no `attempt 1 lease_expired`
/// line and no `attempt_log`), and with the table's times in UTC (the
/// `+05:30` start was not found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_tells_each_attempt_in_local_time() {
    let h = Harness::new().await;
    let url = h.url.as_str();
    cli(url, &["demo", "--runs", "1"]).await;
    let runs = h.store.run_list().await.expect("runs");
    let run = runs[0].id.as_str();

    let doc: Value =
        serde_json::from_str(&cli(url, &["status", run, "--json"]).await).expect("status --json");
    let created = &doc["run"]["created_at"];
    assert!(
        created.as_str().is_some_and(|t| t.ends_with('Z')),
        "{created}"
    );
    let stages = doc["stages"].as_array().expect("stages");
    let draft = stages
        .iter()
        .find(|s| s["stage"] == "draft")
        .expect("a draft stage");
    let log = draft["attempt_log"].as_array().expect("attempt_log");
    let outcomes: Vec<(&Value, &Value, &Value)> = log
        .iter()
        .map(|a| (&a["attempt"], &a["outcome"], &a["worker"]))
        .collect();
    assert_eq!(
        outcomes[0],
        (
            &1.into(),
            &"lease_expired".into(),
            &"demo-doomed-worker".into()
        ),
        "{log:?}"
    );
    assert_eq!(
        (outcomes[1].0, outcomes[1].1),
        (&2.into(), &"succeeded".into())
    );
    assert_eq!(log[1]["proposal_won"], true);

    let table = cli(url, &["status", run]).await;
    let first = format!(
        "attempt 1 lease_expired on demo-doomed-worker, {}, took",
        local(&log[0]["claimed_at"])
    );
    assert!(table.contains(&first), "`{first}` not in:\n{table}");
    let second = format!(
        "attempt 2 succeeded on {}, {}, took",
        log[1]["worker"].as_str().expect("a worker"),
        local(&log[1]["claimed_at"])
    );
    assert!(table.contains(&second), "`{second}` not in:\n{table}");
    assert!(
        table.contains("its proposal is the canonical artifact"),
        "{table}"
    );
    assert!(table.contains("job taken over"), "{table}");
}

/// `reconcile` says what it repaired in a sentence, and gives its counts
/// with `--json`. Seen failing with the report printed as JSON whatever
/// was asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_answers_in_a_sentence_or_json() {
    let h = Harness::new().await;
    let said = cli(&h.url, &["reconcile"]).await;
    assert!(said.starts_with("reconcile: nothing to repair ("), "{said}");
    let doc: Value =
        serde_json::from_str(&cli(&h.url, &["reconcile", "--json"]).await).expect("json");
    assert_eq!(doc["gates_timed_out"], 0, "{doc}");
    assert_eq!(doc["runs_finished"], 0, "{doc}");
}
