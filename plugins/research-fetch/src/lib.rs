//! `research-fetch`: fetches the URL the run was given, sending the
//! operator's search key as `{{secret:search}}` (the host fills it in; the
//! stage never holds it). The response is journaled by the host: a retry
//! after a crash is handed the recorded page and the server is asked once.
use ratchet_plugin_sdk::{Context, Error, HttpRequest, Inputs, Outputs, Stage, export_stage};
use serde::Serialize;

/// What the later stages read.
#[derive(Serialize)]
struct Page {
    url: String,
    status: u16,
    content_type: Option<String>,
    text: String,
}

struct Fetch;

impl Stage for Fetch {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let url = inputs.text("url")?.trim().to_string();
        let request = HttpRequest::get(&url)
            .header("accept", "text/html, text/plain")
            .header("authorization", "Bearer {{secret:search}}")
            .header("idempotency-key", ctx.idempotency_key());
        let response = ctx.http(&request)?;
        ctx.info(&format!("fetched {url}: {}", response.status));
        match response.status {
            200..=299 => {}
            500..=599 | 429 => {
                return Err(Error::retryable(format!(
                    "{url} answered {}",
                    response.status
                )));
            }
            status => return Err(Error::fatal(format!("{url} answered {status}"))),
        }
        let page = Page {
            content_type: response.header("content-type").map(str::to_string),
            text: String::from_utf8_lossy(&response.body).into_owned(),
            status: response.status,
            url,
        };
        Outputs::new().json("page", &page)
    }
}

export_stage!(Fetch);
