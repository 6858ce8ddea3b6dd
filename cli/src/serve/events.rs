//! A run's changes as Server-Sent Events: its state and every stage's at
//! first, then each change (`event: run` or `event: stage`, the data a
//! [`RunChange`]), until the run has finished. A client that reconnects
//! gets the current state again first, so it misses no end state.

use std::convert::Infallible;

use axum::extract::Path;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use ratchet_runtime::client::RunChange;

use super::Shared;
use super::problem::{PROBLEM_JSON, Problem};

/// One event of the stream, by its fields.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // describes the stream's events in the document
pub struct StreamEvent {
    /// `run`, `stage`, or `error` (a problem document, then the end).
    #[schema(pattern = "^(run|stage|error)$")]
    event: String,
    /// Counts from 0 in each stream.
    id: String,
    /// A `RunChange` as JSON (for `error`, a problem document).
    data: String,
}

/// The run's changes, as Server-Sent Events, until it has finished.
#[utoipa::path(get, path = "/runs/{run}/events", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "`event: run` or `event: stage`, each with a RunChange as its JSON data; the stream ends once the run has finished", content_type = "text/event-stream", body = StreamEvent),
        (status = 404, description = "No such run", body = Problem, content_type = PROBLEM_JSON),
    ))]
pub async fn stream(
    api: Shared,
    Path(run): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let mut watch = api.client.watch(&run);
    // A run that does not exist is a 404, not an empty stream.
    let first = watch.next().await?;
    let events = futures_util::stream::unfold(
        (Some(watch), first, 0u64),
        |(watch, pending, id)| async move {
            let mut watch = watch?;
            let next = match pending {
                Some(change) => Ok(Some(change)),
                None => watch.next().await,
            };
            let event = match next {
                Ok(Some(change)) => change_event(&change),
                Ok(None) => return None,
                Err(e) => {
                    let problem = Problem::from(e);
                    let event = Event::default().event("error").json_data(&problem);
                    let event = event.unwrap_or_default();
                    return Some((Ok(event.id(id.to_string())), (None, None, id + 1)));
                }
            };
            Some((Ok(event.id(id.to_string())), (Some(watch), None, id + 1)))
        },
    );
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

fn change_event(change: &RunChange) -> Event {
    let name = match change {
        RunChange::Run { .. } => "run",
        RunChange::Stage { .. } => "stage",
    };
    Event::default()
        .event(name)
        .json_data(change)
        .unwrap_or_default()
}
