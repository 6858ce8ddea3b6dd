//! `split`: a text's paragraphs (separated by blank lines), as a JSON array
//! of strings, for the map-reduce example to map `summarise` over.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Split;

impl Stage for Split {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let text = inputs.text("text")?.replace("\r\n", "\n");
        let parts: Vec<String> = text
            .split("\n\n")
            .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|p| !p.is_empty())
            .collect();
        Outputs::new().json("parts", &parts)
    }
}

export_stage!(Split);
