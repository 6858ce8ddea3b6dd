//! `join`: the summaries of every paragraph (the mapped stage's output, a
//! JSON array in element order) as one numbered digest.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct Join;

impl Stage for Join {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let summaries: Vec<String> = inputs.json("summaries")?;
        let digest: Vec<String> = summaries
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{}. {s}", i + 1))
            .collect();
        Ok(Outputs::new().text("digest", digest.join("\n")))
    }
}

export_stage!(Join);
