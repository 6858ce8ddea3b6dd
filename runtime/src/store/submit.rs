//! Submitting a run: the run, its input artifact, its jobs, edges and input
//! bindings in one transaction. The order of the steps is decided here
//! once; each backend supplies the statements ([`SubmitTx`]).

use super::{
    ArtifactPut, Payload, RUN_INPUT_OUTPUT, RUN_INPUT_STAGE, Result, RunSubmit, RunSubmitOutcome,
};

/// The statements of a submission, inside one open transaction. Each table's
/// rows go in one statement, jobs in `r.jobs` order: a job's id follows its
/// place in the pipeline.
pub(crate) trait SubmitTx {
    /// Inserts the run row unless its idempotency key is taken; returns
    /// whether it did.
    async fn run_insert(&mut self, r: &RunSubmit) -> Result<bool>;
    /// The id of the run that holds this idempotency key.
    async fn run_of_key(&mut self, key: &str) -> Result<String>;
    /// The run's input, canonical-first.
    async fn input_insert(&mut self, input: ArtifactPut<'_>) -> Result<()>;
    /// Every job, with its initial state and pending count
    /// ([`RunSubmit::initial_states`]).
    async fn jobs_insert(&mut self, r: &RunSubmit, states: &[(&str, i64)]) -> Result<()>;
    async fn edges_insert(&mut self, r: &RunSubmit) -> Result<()>;
    async fn inputs_insert(&mut self, r: &RunSubmit) -> Result<()>;
    /// Tells listening workers that jobs became ready, where the backend
    /// can (delivered on commit).
    async fn announce_ready(&mut self) -> Result<()>;
}

/// Creates the run (see [`super::Intake::run_submit`]). The caller commits;
/// on [`RunSubmitOutcome::Existing`] nothing was written.
pub(crate) async fn submit(tx: &mut impl SubmitTx, mut r: RunSubmit) -> Result<RunSubmitOutcome> {
    if !tx.run_insert(&r).await? {
        // A run without a key always inserts: only a key can conflict.
        let key = r.idempotency_key.as_deref().unwrap_or_default();
        return Ok(RunSubmitOutcome::Existing(tx.run_of_key(key).await?));
    }
    let input = Payload::new(
        RUN_INPUT_OUTPUT,
        "application/octet-stream",
        std::mem::take(&mut r.input),
    );
    tx.input_insert(ArtifactPut {
        run_id: &r.run_id,
        stage: RUN_INPUT_STAGE,
        artifact: &input,
        attempt: 0,
        plugin_digest: None,
        now: r.now,
    })
    .await?;
    tx.jobs_insert(&r, &r.initial_states()).await?;
    tx.edges_insert(&r).await?;
    tx.inputs_insert(&r).await?;
    tx.announce_ready().await?;
    Ok(RunSubmitOutcome::Created(r.run_id))
}
