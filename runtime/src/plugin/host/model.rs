//! `model.generate`: journaled canonical-first. The k-th call of a stage in a
//! run is answered from the journal when an earlier attempt recorded it, and
//! otherwise asked of the backend and recorded before the plugin sees it;
//! a backend's refusal is recorded and replayed the same way.

use super::super::HostState;
use super::super::ratchet::stage::model::{Host, ModelError, Request};
use super::{CallContext, HostFailure};
use crate::digest::sha256_hex;
use crate::model::{ModelError as BackendError, ModelRequest};
use crate::store::{ModelCall, ModelCallPut};

impl Host for HostState {
    async fn generate(&mut self, request: Request) -> wasmtime::Result<Result<String, ModelError>> {
        let Some(call) = self.call.as_mut() else {
            return Ok(Err(ModelError::AccessDenied(
                "no model during `describe`".into(),
            )));
        };
        call.count_call()?;
        if !call.grants.model {
            return Ok(Err(ModelError::AccessDenied(
                "the `model` capability is not granted: the manifest must ask for it and the operator's policy must grant it".into(),
            )));
        }
        let request = ModelRequest {
            prompt: request.prompt,
            max_tokens: request.max_tokens,
        };
        Ok(journaled(call, request).await)
    }
}

async fn journaled(call: &mut CallContext, request: ModelRequest) -> Result<String, ModelError> {
    let index = call.next_model_call;
    call.next_model_call += 1;
    let request_digest = sha256_hex(
        serde_json::to_string(&request)
            .unwrap_or_default()
            .as_bytes(),
    );
    let inv = call.inv.clone();

    let recorded = match call
        .store
        .model_call_get(&inv.run_id, &inv.stage, index)
        .await
    {
        Ok(recorded) => recorded,
        Err(e) => {
            call.fail(HostFailure::Journal(e.to_string()));
            return Err(ModelError::Unavailable("model journal unavailable".into()));
        }
    };
    let answer = match recorded {
        Some(recorded) => {
            call.replayed += 1;
            recorded
        }
        None => ask_and_journal(call, &request, index, &request_digest).await?,
    };
    if answer.request_digest != request_digest {
        let failure = HostFailure::NonDeterminism {
            index,
            recorded: answer.request_digest.clone(),
            now: request_digest,
        };
        let message = failure.to_string();
        call.fail(failure);
        return Err(ModelError::Rejected(message));
    }
    crate::crash::point("after_model_call");
    if answer.rejected {
        return Err(ModelError::Rejected(answer.response));
    }
    Ok(answer.response)
}

/// Asks the backend, then journals canonical-first and returns the stored
/// row, not the fresh answer: a racing attempt may have recorded first.
async fn ask_and_journal(
    call: &mut CallContext,
    request: &ModelRequest,
    index: i64,
    request_digest: &str,
) -> Result<ModelCall, ModelError> {
    // A refusal is journaled like an answer: it used this call index, and a
    // retry must meet it there, or its later calls would no longer line up
    // with the journal.
    let (fresh, rejected) = match call.model.generate(request).await {
        Ok(text) => (text, false),
        Err(BackendError::Unavailable(m)) => {
            call.fail(HostFailure::Model(m.clone()));
            return Err(ModelError::Unavailable(m));
        }
        Err(BackendError::Rejected(m)) => (m, true),
    };
    let put = ModelCallPut {
        run_id: call.inv.run_id.clone(),
        stage: call.inv.stage.clone(),
        index,
        request_digest: request_digest.to_string(),
        response: fresh,
        rejected,
        attempt: call.inv.attempt,
        now: call.clock.now_ms(),
    };
    match call.store.model_call_put(put).await {
        Ok(canonical) => {
            if canonical.attempt == call.inv.attempt {
                call.fresh += 1;
            } else {
                call.replayed += 1;
            }
            Ok(canonical)
        }
        Err(e) => {
            call.fail(HostFailure::Journal(e.to_string()));
            Err(ModelError::Unavailable("model journal unavailable".into()))
        }
    }
}
