//! `research-check`: checks the summary against the page it was made from
//! (deterministic: no model). The verdict names the exact page checked.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Summary {
    title: String,
    points: Vec<String>,
    confidence: u8,
}

#[derive(Serialize)]
struct Verdict {
    ok: bool,
    problems: Vec<String>,
    page_sha256: String,
    points: usize,
}

/// A point longer than this is not a summary.
const MAX_POINT_CHARS: usize = 400;

struct Check;

impl Stage for Check {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let page = inputs.bytes("page")?;
        let summary: Summary = inputs.json("summary")?;
        let mut problems = Vec::new();
        if summary.title.trim().is_empty() {
            problems.push("the title is empty".to_string());
        }
        if summary.points.is_empty() {
            problems.push("there are no points".to_string());
        }
        for (i, point) in summary.points.iter().enumerate() {
            if point.chars().count() > MAX_POINT_CHARS {
                problems.push(format!(
                    "point {} is over {MAX_POINT_CHARS} characters",
                    i + 1
                ));
            }
        }
        if !(1..=5).contains(&summary.confidence) {
            problems.push(format!("confidence {} is not 1 to 5", summary.confidence));
        }
        let verdict = Verdict {
            ok: problems.is_empty(),
            problems,
            page_sha256: hex::encode(Sha256::digest(page)),
            points: summary.points.len(),
        };
        Outputs::new().json("verdict", &verdict)
    }
}

export_stage!(Check);
