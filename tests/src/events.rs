//! Committed outbox events for the relay's tests (runs of chained stages,
//! each completed through the store as a worker would), and the check a
//! webhook receiver makes of each delivery.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use ratchet_runtime::store::{
    EdgeKind, EventPattern, JobBatch, NewEdge, NewJob, Routing, RunSubmit, SinkRoute, StageWork,
};

use crate::{Harness, claim, completion, put_stand_in_plugin};

impl Harness {
    /// The names of the run's outbox events, in commit order.
    pub async fn outbox_events(&self, run: &str) -> Vec<String> {
        let rows = self.store.outbox_list(Some(run)).await.expect("outbox");
        rows.into_iter().map(|o| o.event).collect()
    }
}

/// `runs` runs (`run-0`, …) of one chained stage per entry of `emits`, each
/// stage emitting its entry, all completed; returns every event's dedup
/// key per run, in commit order.
pub async fn commit_chains(
    h: &Harness,
    runs: usize,
    emits: &[&str],
) -> BTreeMap<String, Vec<String>> {
    let now = h.clock.now_ms();
    put_stand_in_plugin(h.store.as_ref(), now).await;
    for r in 0..runs {
        let jobs = emits
            .iter()
            .enumerate()
            .map(|(i, event)| NewJob {
                stage: format!("s{i}"),
                work: StageWork::Plugin("p".into()),
                map: None,
                lists: Default::default(),
                outputs: vec!["out".into()],
                emits: vec![event.to_string()],
                max_attempts: 1,
            })
            .collect();
        let edges = (1..emits.len())
            .map(|i| NewEdge {
                from_stage: format!("s{}", i - 1),
                to_stage: format!("s{i}"),
                kind: EdgeKind::After,
            })
            .collect();
        h.store
            .run_submit(RunSubmit {
                run_id: format!("run-{r}"),
                pipeline: "chain".into(),
                idempotency_key: None,
                input: Vec::new(),
                jobs,
                edges,
                inputs: Vec::new(),
                now,
            })
            .await
            .expect("submit");
    }
    loop {
        let jobs = claim(h.store.as_ref(), "w", now, 500).await;
        if jobs.is_empty() {
            break;
        }
        let batch = JobBatch {
            completions: jobs.iter().map(|j| completion(j, "w", now)).collect(),
            claim: None,
        };
        h.store.job_batch(&batch).await.expect("complete");
    }
    let mut events: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in h.store.outbox_list(None).await.expect("outbox") {
        events.entry(row.run_id).or_default().push(row.dedup_key);
    }
    assert_eq!(events.len(), runs);
    events
}

/// The event's run and id when its Standard Webhooks signature under
/// `secret` (`whsec_…`) holds and the body's id is the header's.
pub fn verified(secret: &str, headers: &HeaderMap, body: &[u8]) -> Option<(String, String)> {
    let header = |name: &str| headers.get(name)?.to_str().ok();
    let (id, timestamp, signature) = (
        header("webhook-id")?,
        header("webhook-timestamp")?,
        header("webhook-signature")?,
    );
    let key = BASE64.decode(secret.strip_prefix("whsec_")?).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()));
    let envelope: serde_json::Value = serde_json::from_slice(body).ok()?;
    (signature == expected && envelope["id"] == id).then(|| {
        (
            envelope["run"].as_str().unwrap_or_default().to_string(),
            id.to_string(),
        )
    })
}

/// Routes every event not yet routed (up to `limit`) to the sink `hooks`
/// alone, through the store's own call; returns how many.
pub async fn route_to_hooks(h: &Harness, limit: usize, now: i64) -> usize {
    let routing = hooks_routing(limit, now);
    h.store.deliveries_route(&routing).await.expect("routed")
}

/// The routing of the next page of events not yet routed (up to `limit`)
/// to the sink `hooks`, which takes every event, alone, as a relay with
/// that sink makes it.
pub fn hooks_routing(limit: usize, now: i64) -> Routing {
    Routing {
        page: limit,
        sinks: vec![SinkRoute {
            sink: "hooks".into(),
            events: vec![EventPattern::parse("*").expect("a pattern")],
        }],
        now,
    }
}
