//! One run of a wide fan-out/fan-in (F parallel `pass` stages, then one
//! `noop` join after all of them) completes on every backend: every stage
//! once, the join last, the audit clean, nothing left for a reconcile.
//!
//! F is 2,000 in the normal suite (CI's size) and `RATCHET_FANOUT_STAGES`
//! by hand: 100,000 is item 12 of #20, reported with its times in
//! BENCHMARKS.md (`ratchet bench --fanout 100000` measures them; this test
//! checks the outcome, not the speed).

use std::collections::HashSet;
use std::sync::Arc;

use ratchet_bench::fanout_pipeline;
use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::store::{
    AUDIT_PAGE_JOBS, AuditVisitor, JobState, RUN_INPUT_STAGE, RunAuditFacts, StageAuditPage,
};
use ratchet_tests::{Backend, Harness};

ratchet_tests::backend_tests! {
    a_wide_fan_out_and_fan_in_completes => wide_fanout;
}

fn stages() -> usize {
    std::env::var("RATCHET_FANOUT_STAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

async fn wide_fanout(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    h.register(&["pass", "noop"]).await;
    let stages = stages();
    let run = h.submit(&fanout_pipeline(stages), b"fan").await;
    h.run_until_idle(16).await;

    assert_eq!(h.run_state(&run).await, "succeeded");
    let jobs = h.store.job_list(&run).await.expect("jobs");
    assert_eq!(jobs.len(), stages + 1);
    assert!(jobs.iter().all(|j| j.state == JobState::Succeeded));
    let attempts = h.store.attempt_list(&run).await.expect("attempts");
    assert_eq!(attempts.len(), stages + 1, "every stage ran once");
    let join = attempts
        .iter()
        .find(|a| a.stage == "join")
        .expect("the join ran");
    let last_success = jobs
        .iter()
        .filter(|j| j.stage != "join")
        .filter_map(|j| j.succeeded_seq)
        .max()
        .expect("the fanned-out stages succeeded");
    assert!(
        join.claim_seq > last_success,
        "the join started after every stage it waits for had committed"
    );
    let report = h.audit().await;
    assert!(report.is_clean(), "{:#?}", report.violations);
    let reconciled = h
        .store
        .reconcile(h.clock.now_ms())
        .await
        .expect("reconcile");
    assert!(!reconciled.changed(), "{reconciled:?}");
    audited_a_page_at_a_time(&h, &run, stages).await;
}

/// What the audit was handed, page by page.
#[derive(Default)]
struct Pages {
    runs: usize,
    /// (jobs, attempts, artifacts, outbox rows) of each page
    sizes: Vec<(usize, usize, usize, usize)>,
    join_incoming: Option<(i64, i64)>,
}

impl AuditVisitor for Pages {
    fn run(&mut self, _: RunAuditFacts) {
        self.runs += 1;
    }
    fn stages(&mut self, page: StageAuditPage) {
        // The run's input is stored as an artifact of the stage `$run`.
        let mut stages: HashSet<&str> = page.jobs.iter().map(|j| j.stage.as_str()).collect();
        stages.insert(RUN_INPUT_STAGE);
        assert!(
            page.attempts
                .iter()
                .all(|a| stages.contains(a.stage.as_str()))
        );
        assert!(
            page.artifacts
                .iter()
                .all(|a| stages.contains(a.stage.as_str()))
        );
        if let Some(join) = page.incoming.iter().find(|i| i.stage == "join") {
            self.join_incoming = Some((join.total, join.unsatisfied));
        }
        self.sizes.push((
            page.jobs.len(),
            page.attempts.len(),
            page.artifacts.len(),
            page.outbox.len(),
        ));
    }
}

/// The audit used to read a whole run at once: 836 MB at 100,000 stages
/// on SQLite against 139 MB at 10,000 (`ratchet bench --fanout`). It must
/// take a run a page of jobs at a time, with only those jobs' rows, and a
/// fan-in's edges counted rather than loaded; and what spans pages (the
/// run's state against its stages', an edge from the first page into the
/// last) must still be checked.
///
/// Seen failing on the whole-run read: one page held every job (2,001).
async fn audited_a_page_at_a_time(h: &Harness, run: &str, stages: usize) {
    let mut pages = Pages::default();
    h.store.audit_run(run, &mut pages).await.expect("audit");
    assert_eq!(pages.runs, 1);
    let page = AUDIT_PAGE_JOBS as usize;
    assert!(
        pages.sizes.iter().all(|&(jobs, ..)| jobs <= 1_000),
        "a page of more than 1,000 jobs: {:?}",
        pages.sizes
    );
    assert_eq!(
        pages.sizes.len(),
        (stages + 1).div_ceil(page),
        "{:?}",
        pages.sizes
    );
    for &(jobs, attempts, artifacts, outbox) in &pages.sizes {
        assert!(jobs <= page && attempts <= jobs && artifacts <= jobs + 1 && outbox <= jobs);
    }
    let jobs: usize = pages.sizes.iter().map(|s| s.0).sum();
    assert_eq!(jobs, stages + 1);
    assert_eq!(pages.join_incoming, Some((stages as i64, 0)));

    // `f0` is on the first page, `join` on the last.
    h.raw_sql(&format!(
        "UPDATE edges SET satisfied = 0 WHERE run_id = '{run}' AND from_stage = 'f0';
         UPDATE jobs SET state = 'ready' WHERE run_id = '{run}' AND stage = 'f1';"
    ))
    .await;
    let details: Vec<String> = h
        .audit()
        .await
        .violations
        .into_iter()
        .map(|v| v.detail)
        .collect();
    for expected in [
        "succeeded, but its edge to `join` was never satisfied",
        "the run is `succeeded`, but this stage is ready",
    ] {
        assert!(
            details.iter().any(|d| d.contains(expected)),
            "{expected}: {details:#?}"
        );
    }
}
