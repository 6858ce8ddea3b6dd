//! Mapping a stage over a list (`map = "split.parts"`, docs/map.md): the
//! order of the steps is decided here once; each backend supplies the
//! statements ([`MapTx`]) in its own folder.
//!
//! A mapped stage's job waits like any job. The transaction that releases
//! it (the completion of the list's stage, when that is the last thing it
//! waits for) expands it instead of making it ready: each element of the
//! list is stored canonical-first as an artifact of the list's stage
//! (`parts[7]`), and gets a job of its own (`summarise[7]`) bound to it,
//! with an edge from the list's stage and one into the mapped stage's job,
//! which then waits for its elements. So there is never a committed list
//! without all of its jobs. The transaction that releases it again (the
//! last element's completion) joins it: each output becomes one JSON array
//! of the elements' outputs in element order, stored canonical-first as the
//! mapped stage's own output, and the job succeeds as a host attempt
//! (`store::host`), releasing its dependents.

use std::collections::BTreeMap;

use super::host::{HostAttempt, HostTx};
use super::rows::{RowExt, corrupt, json_list};
use super::{ArtifactPut, Payload, Result};

/// The worker name of a mapped stage's host attempts.
pub(crate) const MAP_WORKER: &str = "host:map";

/// A job that maps over a list, released, its row locked.
#[derive(Clone)]
pub(crate) struct MapJob {
    pub job_id: i64,
    pub run_id: String,
    pub stage: String,
    pub attempt: i64,
    /// The list: `(stage, output)`.
    pub source: (String, String),
    /// The most elements the list may hold.
    pub cap: i64,
    /// How many elements it was expanded into, once it was.
    pub count: Option<i64>,
    pub outputs: Vec<String>,
}

/// A stored artifact as a map reads it.
pub(crate) struct StoredBytes {
    pub bytes: Vec<u8>,
    pub media_type: String,
    pub attempt: i64,
    pub plugin_digest: Option<String>,
}

impl MapJob {
    /// A `jobs` row read with its `map_stage`, `map_output` and `map_cap`.
    pub(crate) fn from_row(row: &impl RowExt) -> Result<Self> {
        let stage = row.text("stage")?;
        let corrupt_map = || corrupt("jobs", format!("`{stage}` maps over a list but names none"));
        Ok(Self {
            job_id: row.int("id")?,
            run_id: row.text("run_id")?,
            attempt: row.int("attempt")?,
            source: (
                row.opt_text("map_stage")?.ok_or_else(corrupt_map)?,
                row.opt_text("map_output")?.ok_or_else(corrupt_map)?,
            ),
            cap: row.opt_int("map_cap")?.ok_or_else(corrupt_map)?,
            count: row.opt_int("map_count")?,
            outputs: json_list("jobs", &row.text("outputs")?)?,
            stage,
        })
    }
}

impl StoredBytes {
    pub(crate) fn from_row(row: &impl RowExt) -> Result<Self> {
        Ok(Self {
            bytes: row.opt_blob("bytes")?.unwrap_or_default(),
            media_type: row.text("media_type")?,
            attempt: row.int("attempt")?,
            plugin_digest: row.opt_text("plugin_digest")?,
        })
    }
}

/// The statements of expanding and joining, inside one open transaction.
pub(crate) trait MapTx: HostTx {
    /// The jobs of these `(run, stage)` keys that map over a list, rows
    /// locked where the backend locks rows, in job id order.
    async fn map_jobs(&mut self, keys: &[(String, String)]) -> Result<Vec<MapJob>>;
    /// The stored artifact under `(run, stage, output)`.
    async fn artifact_bytes(
        &mut self,
        run: &str,
        stage: &str,
        output: &str,
    ) -> Result<Option<StoredBytes>>;
    /// Stores the elements (each unless its key is taken: the stored one
    /// is canonical) and creates the element jobs of `m`, element `i`
    /// named `STAGE[i]`, `ready` at `now`, bound as `m` is except that its
    /// inputs bound to the list are bound to element `i`; with a satisfied
    /// edge from the list's stage and an unsatisfied one into `m`, which
    /// then waits, `blocked`, for all of them (its run's count of
    /// unfinished jobs raised by as many).
    async fn elements_create(
        &mut self,
        m: &MapJob,
        elements: &[ArtifactPut<'_>],
        now: i64,
    ) -> Result<()>;
    /// Each element's stored output `output`, in element order (as many as
    /// are stored).
    async fn element_outputs(&mut self, m: &MapJob, output: &str) -> Result<Vec<StoredBytes>>;
}

/// Expands or joins each released job that maps over a list, and whatever
/// those release in turn, in the caller's transaction.
pub(crate) async fn advance(
    tx: &mut impl MapTx,
    mut released: Vec<(String, String)>,
    now: i64,
) -> Result<()> {
    while !released.is_empty() {
        let jobs = tx.map_jobs(&released).await?;
        released = Vec::new();
        for job in &jobs {
            let more = match job.count {
                None => expand(tx, job, now).await?,
                Some(_) => join(tx, job, now).await?,
            };
            released.extend(more);
        }
    }
    Ok(())
}

/// The element jobs of `m`; a list that is not a JSON array, or longer
/// than the cap, fails the mapped stage instead. An empty list joins at
/// once.
async fn expand(tx: &mut impl MapTx, m: &MapJob, now: i64) -> Result<Vec<(String, String)>> {
    let (stage, output) = (&m.source.0, &m.source.1);
    let Some(list) = tx.artifact_bytes(&m.run_id, stage, output).await? else {
        let error = format!("the list `{stage}.{output}` is not stored");
        return fail(tx, m, error, now).await;
    };
    let elements = match elements_of(&list, m) {
        Ok(elements) => elements,
        Err(error) => return fail(tx, m, error, now).await,
    };
    let payloads: Vec<Payload> = elements
        .iter()
        .enumerate()
        .map(|(i, element)| {
            let bytes = serde_json::to_vec(element).expect("a JSON value serializes");
            Payload::new(element_name(output, i), "application/json", bytes)
        })
        .collect();
    let puts: Vec<ArtifactPut<'_>> = payloads
        .iter()
        .map(|payload| ArtifactPut {
            run_id: &m.run_id,
            stage,
            artifact: payload,
            attempt: list.attempt,
            plugin_digest: list.plugin_digest.as_deref(),
            now,
        })
        .collect();
    tx.elements_create(m, &puts, now).await?;
    crate::crash::point("after_map_expand");
    if payloads.is_empty() {
        let expanded = MapJob {
            count: Some(0),
            ..m.clone()
        };
        return join(tx, &expanded, now).await;
    }
    Ok(Vec::new())
}

/// `STAGE[i]` or `OUTPUT[i]`: the name of element `i`.
pub fn element_name(name: &str, i: usize) -> String {
    format!("{name}[{i}]")
}

/// The list's elements, checked against the cap (as the list's own
/// attempt did before it committed, `scheduler`).
fn elements_of(list: &StoredBytes, m: &MapJob) -> Result<Vec<serde_json::Value>, String> {
    let (stage, output) = (&m.source.0, &m.source.1);
    list_elements(&list.bytes, m.cap).map_err(|what| {
        format!(
            "`{}` cannot be mapped over `{stage}.{output}`: it is {what}",
            m.stage
        )
    })
}

/// The elements of a list a stage maps over: a JSON array of at most
/// `cap` elements. Otherwise what it is instead, in words.
pub fn list_elements(bytes: &[u8], cap: i64) -> Result<Vec<serde_json::Value>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON ({e})"))?;
    let serde_json::Value::Array(elements) = value else {
        return Err(format!("a JSON {}, not an array", json_kind(&value)));
    };
    if elements.len() as i64 > cap {
        return Err(format!(
            "an array of {} elements, more than the {cap} a map may create (raise `max_map_elements` under [caps] in the operator policy)",
            elements.len()
        ));
    }
    Ok(elements)
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// Each output of `m` as the JSON array of its elements' outputs, stored
/// canonical-first by a host attempt that then succeeds the job.
async fn join(tx: &mut impl MapTx, m: &MapJob, now: i64) -> Result<Vec<(String, String)>> {
    let mut arrays = Vec::with_capacity(m.outputs.len());
    let count = m.count.unwrap_or(0);
    for output in &m.outputs {
        let elements = tx.element_outputs(m, output).await?;
        if elements.len() as i64 != count {
            return Err(corrupt(
                "artifacts",
                format!(
                    "`{}` joins {count} elements, but {} of them stored `{output}`",
                    m.stage,
                    elements.len()
                ),
            ));
        }
        match joined(m, output, &elements) {
            Ok(array) => arrays.push(Payload::new(output.clone(), "application/json", array)),
            Err(error) => return fail(tx, m, error, now).await,
        }
    }
    let host = host_attempt(m, now);
    host.take(tx).await?;
    let mut outputs = BTreeMap::new();
    for array in &arrays {
        let stored = host.put(tx, array).await?;
        outputs.insert(array.name.clone(), stored.digest);
    }
    host.succeed(tx, &outputs, &BTreeMap::new()).await
}

/// The JSON array of the elements' `output`: each a JSON value when it is
/// one, else its text as a string.
fn joined(m: &MapJob, output: &str, elements: &[StoredBytes]) -> Result<Vec<u8>, String> {
    let mut values = Vec::with_capacity(elements.len());
    for (i, element) in elements.iter().enumerate() {
        let json = element
            .media_type
            .starts_with("application/json")
            .then(|| serde_json::from_slice(&element.bytes).ok())
            .flatten();
        let value = match json {
            Some(value) => value,
            None => match std::str::from_utf8(&element.bytes) {
                Ok(text) => serde_json::Value::String(text.to_string()),
                Err(_) => {
                    return Err(format!(
                        "`{}.{output}` of element {i} is neither JSON nor UTF-8 text, so it cannot join `{}.{output}`'s JSON array",
                        element_name(&m.stage, i),
                        m.stage
                    ));
                }
            },
        };
        values.push(value);
    }
    Ok(serde_json::to_vec(&values).expect("JSON values serialize"))
}

/// Fails the mapped stage by a host attempt: the job dead, the run failed.
async fn fail(
    tx: &mut impl MapTx,
    m: &MapJob,
    error: String,
    now: i64,
) -> Result<Vec<(String, String)>> {
    let host = host_attempt(m, now);
    host.take(tx).await?;
    host.fail(tx, error, BTreeMap::new()).await?;
    Ok(Vec::new())
}

/// The next attempt of `m`, made by the host.
fn host_attempt(m: &MapJob, now: i64) -> HostAttempt<'_> {
    HostAttempt {
        job_id: m.job_id,
        attempt: m.attempt + 1,
        run_id: &m.run_id,
        stage: &m.stage,
        worker: MAP_WORKER,
        now,
    }
}

/// Whether `stage` names an element of a mapped stage (`NAME[i]`): no
/// stage of a pipeline can, its names being checked.
pub fn is_element(stage: &str) -> bool {
    stage.ends_with(']')
}
