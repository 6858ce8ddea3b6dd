//! `http-probe`: sends the request its input describes (`{"method", "url",
//! "headers": [[name, value]]}`) and proposes what came back:
//! `{"status", "headers", "body"}`, or `{"error", "retryable"}` when the
//! host refused or the request failed. Tests read from it what a guest sees.
use ratchet_plugin_sdk::{Context, Error, HttpRequest, Inputs, Outputs, Stage, export_stage};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Asked {
    #[serde(default = "get")]
    method: String,
    url: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

fn get() -> String {
    "GET".into()
}

struct Probe;

impl Stage for Probe {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let asked: Asked = inputs.json("request")?;
        let mut request = HttpRequest::new(&asked.method, asked.url);
        for (name, value) in &asked.headers {
            request = request.header(name, value.as_str());
        }
        let result = match ctx.http(&request) {
            Ok(response) => json!({
                "status": response.status,
                "headers": response.headers,
                "body": String::from_utf8_lossy(&response.body),
            }),
            Err(e) => json!({ "error": e.message, "retryable": e.retryable }),
        };
        Outputs::new().json("result", &result)
    }
}

export_stage!(Probe);
