//! Row mapping shared by every backend: each backend says how to read a
//! column of its row type ([`RowExt`]); the mappers from columns to the
//! store's row types are written once, here.

use std::collections::BTreeMap;

use super::*;
use crate::llm::{FinishReason, Usage};

/// Typed column access. Integers are 64-bit and flags are stored as
/// integers in both schemas.
pub(crate) trait RowExt {
    fn text(&self, column: &str) -> Result<String>;
    fn opt_text(&self, column: &str) -> Result<Option<String>>;
    fn int(&self, column: &str) -> Result<i64>;
    fn opt_int(&self, column: &str) -> Result<Option<i64>>;
    fn opt_blob(&self, column: &str) -> Result<Option<Vec<u8>>>;
}

macro_rules! impl_row_ext {
    ($row:ty) => {
        impl $crate::store::rows::RowExt for $row {
            fn text(&self, column: &str) -> $crate::store::Result<String> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
            fn opt_text(&self, column: &str) -> $crate::store::Result<Option<String>> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
            fn int(&self, column: &str) -> $crate::store::Result<i64> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
            fn opt_int(&self, column: &str) -> $crate::store::Result<Option<i64>> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
            fn opt_blob(&self, column: &str) -> $crate::store::Result<Option<Vec<u8>>> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
        }
    };
}
pub(crate) use impl_row_ext;

pub(crate) fn corrupt(table: &'static str, detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        table,
        detail: detail.to_string(),
    }
}

/// A row of a call whose statements mark their rows with a `kind`, of a
/// kind the call does not make.
pub(crate) fn unknown_kind(table: &'static str, kind: &str) -> StoreError {
    corrupt(table, format!("a row of unknown kind `{kind}`"))
}

/// The jobs of a claim and their canonical inputs, from rows that give each
/// job before its inputs and name it by a key (its place, or its id).
#[derive(Default)]
pub(crate) struct ClaimedRows {
    jobs: Vec<ClaimedJob>,
    place: std::collections::HashMap<i64, usize>,
}

impl ClaimedRows {
    pub(crate) fn job(&mut self, key: i64, mut job: ClaimedJob) {
        job.inputs = Some(Vec::new());
        self.place.insert(key, self.jobs.len());
        self.jobs.push(job);
    }

    pub(crate) fn input(&mut self, key: i64, input: LoadedInput) -> Result<()> {
        let job = self
            .place
            .get(&key)
            .and_then(|&p| self.jobs.get_mut(p))
            .ok_or_else(|| {
                corrupt(
                    "job_inputs",
                    format!("an input of claimed job {key}, which is not in the claim"),
                )
            })?;
        job.inputs.get_or_insert_default().push(input);
        Ok(())
    }

    pub(crate) fn into_jobs(self) -> Vec<ClaimedJob> {
        self.jobs
    }
}

pub(crate) fn json_list(table: &'static str, text: &str) -> Result<Vec<String>> {
    serde_json::from_str(text).map_err(|e| corrupt(table, e))
}

fn json_map(table: &'static str, text: Option<String>) -> Result<Option<BTreeMap<String, String>>> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| corrupt(table, e)))
        .transpose()
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

pub(crate) fn run_row(row: &impl RowExt) -> Result<RunRow> {
    Ok(RunRow {
        id: row.text("id")?,
        pipeline: row.text("pipeline")?,
        state: {
            let state = row.text("state")?;
            RunState::parse(&state)
                .ok_or_else(|| corrupt("runs", format!("unknown state `{state}`")))?
        },
        idempotency_key: row.opt_text("idempotency_key")?,
        created_at: row.int("created_at")?,
        finished_at: row.opt_int("finished_at")?,
        failed_seq: row.opt_int("failed_seq")?,
    })
}

pub(crate) fn job_row(row: &impl RowExt) -> Result<JobRow> {
    let state = row.text("state")?;
    Ok(JobRow {
        id: row.int("id")?,
        run_id: row.text("run_id")?,
        stage: row.text("stage")?,
        plugin_digest: row.opt_text("plugin_digest")?,
        gate: row.opt_text("gate")?,
        gate_timeout_ms: row.opt_int("gate_timeout_ms")?,
        map: row
            .opt_text("map_stage")?
            .zip(row.opt_text("map_output")?)
            .map(|(stage, output)| format!("{stage}.{output}")),
        map_count: row.opt_int("map_count")?,
        state: JobState::parse(&state)
            .ok_or_else(|| corrupt("jobs", format!("unknown state `{state}`")))?,
        pending: row.int("pending")?,
        attempt: row.int("attempt")?,
        max_attempts: row.int("max_attempts")?,
        lease_owner: row.opt_text("lease_owner")?,
        lease_expires_at: row.opt_int("lease_expires_at")?,
        next_run_at: row.int("next_run_at")?,
        last_error: row.opt_text("last_error")?,
        succeeded_seq: row.opt_int("succeeded_seq")?,
        outputs: json_list("jobs", &row.text("outputs")?)?,
        emits: json_list("jobs", &row.text("emits")?)?,
    })
}

/// The claim's view of a job row just moved to `running`.
/// A fenced job row: `id, attempt, run_id, stage, plugin_digest, emits`.
pub(crate) fn fenced(row: &impl RowExt) -> Result<crate::store::complete::Fenced> {
    Ok(crate::store::complete::Fenced {
        job_id: row.int("id")?,
        attempt: row.int("attempt")?,
        run_id: row.text("run_id")?,
        stage: row.text("stage")?,
        plugin_digest: row.text("plugin_digest")?,
        emits: json_list("jobs", &row.text("emits")?)?,
    })
}

/// A satisfied edge: `run_id, from_stage, to_stage`.
pub(crate) fn fenced_job(row: &impl RowExt) -> Result<crate::store::fail::FencedJob> {
    Ok(crate::store::fail::FencedJob {
        run_id: row.text("run_id")?,
        max_attempts: row.int("max_attempts")?,
    })
}

pub(crate) fn lapsed_lease(row: &impl RowExt) -> Result<crate::store::fail::LapsedLease> {
    Ok(crate::store::fail::LapsedLease {
        job_id: row.int("id")?,
        run_id: row.text("run_id")?,
        attempt: row.int("attempt")?,
    })
}

pub(crate) fn edge_satisfied(row: &impl RowExt) -> Result<crate::store::complete::EdgeSatisfied> {
    Ok(crate::store::complete::EdgeSatisfied {
        run_id: row.text("run_id")?,
        from_stage: row.text("from_stage")?,
        to_stage: row.text("to_stage")?,
    })
}

/// A claimed job's row; `lease` is (claimed at, lease expires at).
pub(crate) fn claimed_job(
    row: &impl RowExt,
    job_id: i64,
    (claimed_at, lease_expires_at): (i64, i64),
) -> Result<ClaimedJob> {
    Ok(ClaimedJob {
        job_id,
        run_id: row.text("run_id")?,
        stage: row.text("stage")?,
        plugin_digest: row.text("plugin_digest")?,
        attempt: row.int("attempt")?,
        max_attempts: row.int("max_attempts")?,
        claimed_at,
        lease_expires_at,
        taken_over: false,
        outputs: json_list("jobs", &row.text("outputs")?)?,
        emits: json_list("jobs", &row.text("emits")?)?,
        lists: match row.opt_text("lists")? {
            Some(lists) => serde_json::from_str(&lists)
                .map_err(|e| corrupt("jobs", format!("lists `{lists}`: {e}")))?,
            None => BTreeMap::new(),
        },
        inputs: None,
    })
}

pub(crate) fn plugin_version(row: &impl RowExt) -> Result<PluginVersion> {
    let version = row.text("version")?;
    Ok(PluginVersion {
        digest: row.text("digest")?,
        name: row.text("name")?,
        version: semver::Version::parse(&version)
            .map_err(|e| corrupt("plugins", format!("version `{version}`: {e}")))?,
        yanked: row.int("yanked")? != 0,
    })
}

/// The [`version_key`] of a version as the `plugins` table holds it.
pub(crate) fn version_key_of(version: &str) -> Result<String> {
    semver::Version::parse(version)
        .map(|v| version_key(&v))
        .map_err(|e| corrupt("plugins", format!("version `{version}` is not semver: {e}")))
}

pub(crate) fn plugin_summary(row: &impl RowExt) -> Result<PluginSummary> {
    Ok(PluginSummary {
        digest: row.text("digest")?,
        name: row.text("name")?,
        version: row.text("version")?,
        manifest: row.text("manifest")?,
        size: row.int("size")?,
        registered_at: row.int("registered_at")?,
        yanked: row.int("yanked")? != 0,
        contract: row.text("contract")?,
    })
}

pub(crate) fn artifact_meta(row: &impl RowExt) -> Result<ArtifactMeta> {
    Ok(ArtifactMeta {
        run_id: row.text("run_id")?,
        stage: row.text("stage")?,
        output: row.text("output")?,
        media_type: row.text("media_type")?,
        digest: row.text("digest")?,
        size: row.int("size")?,
        attempt: row.int("attempt")?,
        plugin_digest: row.opt_text("plugin_digest")?,
        created_at: row.int("created_at")?,
    })
}

pub(crate) fn model_call(row: &impl RowExt) -> Result<ModelCall> {
    let kind = match row.text("kind")?.as_str() {
        "model" => CallKind::Model,
        "http" => CallKind::Http,
        other => return Err(corrupt("model_calls", format!("a call of kind `{other}`"))),
    };
    let rejected = row.int("rejected")? != 0;
    let response = row.opt_blob("response")?.unwrap_or_default();
    // An HTTP row's `response` is the body's bytes, unless it was refused.
    let (http, response) = match (kind, rejected) {
        (CallKind::Http, false) => (Some(http_reply(row, response)?), Vec::new()),
        _ => (None, response),
    };
    Ok(ModelCall {
        kind,
        run_id: row.text("run_id")?,
        stage: row.text("stage")?,
        index: row.int("call_index")?,
        request_digest: row.text("request_digest")?,
        // Stored as bytes (a NUL is a valid character of an answer).
        response: String::from_utf8(response)
            .map_err(|e| corrupt("model_calls", format!("an answer that is not UTF-8: {e}")))?,
        rejected,
        attempt: row.int("attempt")?,
        usage: match (
            row.opt_int("prompt_tokens")?,
            row.opt_int("completion_tokens")?,
        ) {
            (Some(prompt), Some(completion)) => Some(Usage {
                prompt_tokens: token_count(prompt)?,
                completion_tokens: token_count(completion)?,
            }),
            _ => None,
        },
        finish_reason: row
            .opt_text("finish_reason")?
            .as_deref()
            .map(FinishReason::parse),
        model: row.opt_text("model")?,
        http,
    })
}

fn http_reply(row: &impl RowExt, body: Vec<u8>) -> Result<HttpReply> {
    let status = row
        .opt_int("http_status")?
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| corrupt("model_calls", "an HTTP response without a status"))?;
    let headers = row.opt_text("http_headers")?.unwrap_or_default();
    let headers = serde_json::from_str(&headers).map_err(|e| {
        corrupt(
            "model_calls",
            format!("HTTP headers that are not a JSON list: {e}"),
        )
    })?;
    Ok(HttpReply {
        status,
        headers,
        body,
    })
}

fn token_count(n: i64) -> Result<u32> {
    u32::try_from(n).map_err(|_| corrupt("model_calls", format!("a token count of {n}")))
}

pub(crate) fn attempt_row(row: &impl RowExt) -> Result<AttemptRow> {
    Ok(AttemptRow {
        job_id: row.int("job_id")?,
        attempt: row.int("attempt")?,
        run_id: row.text("run_id")?,
        stage: row.text("stage")?,
        worker: row.text("worker")?,
        plugin_digest: row.opt_text("plugin_digest")?,
        claim_seq: row.int("claim_seq")?,
        claimed_at: row.int("claimed_at")?,
        finished_at: row.opt_int("finished_at")?,
        outcome: row.text("outcome")?,
        error: row.opt_text("error")?,
        input_digests: json_map("attempts", row.opt_text("input_digests")?)?,
        proposal_digests: json_map("attempts", row.opt_text("proposal_digests")?)?,
        canonical_digests: json_map("attempts", row.opt_text("canonical_digests")?)?,
        proposal_won: row.opt_int("proposal_won")?.map(|w| w != 0),
        deps_seen: row.opt_int("deps_seen")?,
    })
}

pub(crate) fn outbox_row(row: &impl RowExt) -> Result<OutboxRow> {
    Ok(OutboxRow {
        id: row.int("id")?,
        dedup_key: row.text("dedup_key")?,
        run_id: row.text("run_id")?,
        stage: row.text("stage")?,
        event: row.text("event")?,
        payload: row.text("payload")?,
        created_at: row.int("created_at")?,
    })
}

/// A claimed delivery: the event's columns, then `delivery_id`, `sink`,
/// `attempts` and `retrying_since`.
pub(crate) fn claimed_delivery(row: &impl RowExt) -> Result<ClaimedDelivery> {
    Ok(ClaimedDelivery {
        id: row.int("delivery_id")?,
        sink: row.text("sink")?,
        attempts: row.int("attempts")?,
        retrying_since: row.int("retrying_since")?,
        lease: DeliveryLease {
            holder: row.int("lease_holder")?,
            attempts: row.int("lease_attempts")?,
        },
        event: outbox_row(row)?,
    })
}

pub(crate) fn delivery_row(row: &impl RowExt) -> Result<DeliveryRow> {
    let state = row.text("state")?;
    Ok(DeliveryRow {
        id: row.int("id")?,
        outbox_id: row.int("outbox_id")?,
        dedup_key: row.text("dedup_key")?,
        event: row.text("event")?,
        run_id: row.text("run_id")?,
        stage: row.text("stage")?,
        sink: row.text("sink")?,
        state: DeliveryState::parse(&state)
            .ok_or_else(|| corrupt("deliveries", format!("unknown state `{state}`")))?,
        attempts: row.int("attempts")?,
        next_at: row.int("next_at")?,
        last_status: row.opt_int("last_status")?,
        last_error: row.opt_text("last_error")?,
        created_at: row.int("created_at")?,
        delivered_at: row.opt_int("delivered_at")?,
    })
}

pub(crate) fn edge_row(row: &impl RowExt) -> Result<(String, NewEdge, bool)> {
    let kind = row.text("kind")?;
    Ok((
        row.text("run_id")?,
        NewEdge {
            from_stage: row.text("from_stage")?,
            to_stage: row.text("to_stage")?,
            kind: match kind.as_str() {
                "after" => EdgeKind::After,
                "data" => EdgeKind::Data,
                other => return Err(corrupt("edges", format!("unknown kind `{other}`"))),
            },
        },
        row.int("satisfied")? != 0,
    ))
}

/// A run's graph from its `edges` and `job_inputs` rows.
pub(crate) fn run_graph(edges: &[impl RowExt], inputs: &[impl RowExt]) -> Result<RunGraph> {
    let edges = edges.iter().map(|row| {
        let (_, edge, satisfied) = edge_row(row)?;
        Ok(GraphEdge {
            from_stage: edge.from_stage,
            to_stage: edge.to_stage,
            kind: edge.kind,
            satisfied,
        })
    });
    Ok(RunGraph {
        edges: edges.collect::<Result<_>>()?,
        inputs: inputs
            .iter()
            .map(|row| Ok(input_row(row)?.1))
            .collect::<Result<_>>()?,
    })
}

pub(crate) fn input_row(row: &impl RowExt) -> Result<(String, InputBinding)> {
    Ok((
        row.text("run_id")?,
        InputBinding {
            stage: row.text("stage")?,
            input: row.text("input")?,
            from_stage: row.text("from_stage")?,
            from_output: row.text("from_output")?,
        },
    ))
}

/// A binding with the digest of the artifact it names (`source_digest`).
pub(crate) fn sourced_input(row: &impl RowExt) -> Result<(InputBinding, Option<String>)> {
    Ok((input_row(row)?.1, row.opt_text("source_digest")?))
}

pub(crate) fn incoming_edges(row: &impl RowExt) -> Result<IncomingEdges> {
    Ok(IncomingEdges {
        stage: row.text("to_stage")?,
        total: row.int("total")?,
        unsatisfied: row.int("unsatisfied")?,
    })
}

pub(crate) fn early_start(row: &impl RowExt) -> Result<EarlyStart> {
    Ok(EarlyStart {
        stage: row.text("stage")?,
        attempt: row.int("attempt")?,
        claim_seq: row.int("claim_seq")?,
        from_stage: row.text("from_stage")?,
        from_succeeded_seq: row.opt_int("succeeded_seq")?,
    })
}

pub(crate) fn run_event(row: &impl RowExt) -> Result<RunEvent> {
    Ok(RunEvent {
        run_id: row.text("run_id")?,
        stage: row.opt_text("stage")?,
        kind: row.text("kind")?,
        detail: row.text("detail")?,
        at: row.int("at")?,
    })
}

/// Why a repin must not happen (`store::repin`).
pub(crate) fn repin_refusal(
    run_state: &str,
    job_state: &str,
    pinned: &str,
    r: &JobRepin,
) -> Option<RepinOutcome> {
    if run_state != "running" {
        return Some(RepinOutcome::RunFinished(run_state.to_string()));
    }
    let state = JobState::parse(job_state)?;
    if !matches!(state, JobState::Blocked | JobState::Ready) {
        return Some(RepinOutcome::JobNotWaiting(state));
    }
    (pinned != r.from_digest).then(|| RepinOutcome::PinMoved(pinned.to_string()))
}

/// The ordering edges a repin adds into `stage` for the new version's
/// `after`: each named stage with no edge into `stage` yet, with whether it
/// has already succeeded (the edge is then satisfied). `edges` are the
/// run's `(from, to)` pairs and `states` its jobs' states. Refused, with the
/// reason, for a stage the run does not have, the stage itself, or a stage
/// that already runs after `stage` (the new edge would close a cycle and
/// neither could ever start).
pub(crate) fn repin_after_edges(
    stage: &str,
    after: &[String],
    edges: &[(String, String)],
    states: &BTreeMap<String, JobState>,
) -> std::result::Result<Vec<(String, bool)>, String> {
    let mut downstream = std::collections::BTreeSet::from([stage]);
    let mut frontier = vec![stage];
    while let Some(from) = frontier.pop() {
        for (_, to) in edges.iter().filter(|(f, _)| f == from) {
            if downstream.insert(to.as_str()) {
                frontier.push(to);
            }
        }
    }
    let mut added = Vec::new();
    for dep in after {
        let Some(state) = states.get(dep) else {
            return Err(format!(
                "the new version must run after stage `{dep}`, which this run does not have"
            ));
        };
        if downstream.contains(dep.as_str()) {
            return Err(format!(
                "the new version must run after stage `{dep}`, which runs after `{stage}` in this run (a cycle)"
            ));
        }
        let present = edges.iter().any(|(f, t)| f == dep && t == stage)
            || added.iter().any(|(d, _)| d == dep);
        if !present {
            added.push((dep.clone(), *state == JobState::Succeeded));
        }
    }
    Ok(added)
}

/// A run's `(stage, state)` rows by stage.
pub(crate) fn run_job_states(rows: Vec<(String, String)>) -> Result<BTreeMap<String, JobState>> {
    rows.into_iter()
        .map(|(stage, state)| {
            let parsed = JobState::parse(&state)
                .ok_or_else(|| corrupt("jobs", format!("unknown job state `{state}`")))?;
            Ok((stage, parsed))
        })
        .collect()
}

pub(crate) fn loaded_input(row: &impl RowExt) -> Result<LoadedInput> {
    let artifact = match row.opt_blob("bytes")? {
        Some(bytes) => Some(Artifact {
            meta: artifact_meta(row)?,
            bytes,
        }),
        None => None,
    };
    Ok(LoadedInput {
        input: row.text("input")?,
        from_stage: row.text("from_stage")?,
        from_output: row.text("from_output")?,
        artifact,
    })
}
