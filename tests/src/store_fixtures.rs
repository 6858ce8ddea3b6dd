//! Rows and calls for store tests that drive jobs without running them.

use ratchet_runtime::store::{ClaimedJob, JobClaim, JobComplete, Payload, PluginPut, Store};

/// Registers plugin `p` with a one-byte stand-in component: for store tests
/// whose jobs are never executed.
pub async fn put_stand_in_plugin(store: &dyn Store, now: i64) {
    store
        .plugin_put(PluginPut {
            digest: "p".into(),
            name: "p".into(),
            version: "1.0.0".into(),
            manifest: String::new(),
            component: vec![0],
            contract: "0.2.0".into(),
            now,
        })
        .await
        .expect("plugin");
}

/// A completion of `job` by `worker` with one output, `out`, whose bytes
/// name the stage, the worker and the attempt.
pub fn completion(job: &ClaimedJob, worker: &str, now: i64) -> JobComplete {
    let bytes = format!("{} by {worker} on attempt {}", job.stage, job.attempt).into_bytes();
    JobComplete {
        job_id: job.job_id,
        attempt: job.attempt,
        worker: worker.into(),
        job: job.into(),
        outputs: vec![Payload::new("out", "text/plain", bytes)],
        input_digests: Default::default(),
        now,
    }
}

/// A claim of up to `limit` jobs for `worker` with a one-second lease.
pub fn job_claim(worker: &str, now: i64, limit: usize) -> JobClaim {
    JobClaim {
        worker: worker.into(),
        now,
        lease_ms: 1_000,
        limit,
        only_job: None,
        caps: Default::default(),
    }
}

/// Claims up to `limit` jobs for `worker` with a one-second lease.
pub async fn claim(store: &dyn Store, worker: &str, now: i64, limit: usize) -> Vec<ClaimedJob> {
    let claim = job_claim(worker, now, limit);
    store.job_claim(claim).await.expect("claim")
}

/// `(stage, attempt)` of each job.
pub fn stages(jobs: &[ClaimedJob]) -> Vec<(&str, i64)> {
    jobs.iter().map(|j| (j.stage.as_str(), j.attempt)).collect()
}
