//! `research-summarise`: asks the model for a structured summary of the
//! fetched page (a serde type with its JSON Schema); the host hands over
//! only an answer that fits it.
use ratchet_plugin_sdk::{Chat, Context, Error, Inputs, Outputs, Stage, export_stage};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Page {
    url: String,
    text: String,
}

/// What the model must answer.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub title: String,
    /// The page's main points, most important first.
    #[schemars(length(min = 1, max = 5))]
    pub points: Vec<String>,
    /// 1 (unsure) to 5 (the page says so plainly).
    #[schemars(range(min = 1, max = 5))]
    pub confidence: u8,
}

/// The most of the page put into the prompt.
const MAX_PAGE_CHARS: usize = 8_000;

struct Summarise;

impl Stage for Summarise {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let page: Page = inputs.json("page")?;
        let text: String = page.text.chars().take(MAX_PAGE_CHARS).collect();
        let chat = Chat::new()
            .system("You summarise web pages for researchers. Answer in the JSON shape asked.")
            .user(format!("Summarise the page at {}:\n\n{text}", page.url))
            .temperature(0.2)
            .max_tokens(600);
        let summary: Summary = ctx.structured(&chat)?;
        Outputs::new().json("summary", &summary)
    }
}

export_stage!(Summarise);
