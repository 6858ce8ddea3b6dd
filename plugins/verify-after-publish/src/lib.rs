//! Test plugin: `verify@1.1.0`, which declares `after = ["publish"]`, for
//! upgrade tests; it reports the draft's length.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct VerifyAfterPublish;

impl Stage for VerifyAfterPublish {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let length = inputs.bytes("draft")?.len();
        Ok(Outputs::new().text("report", format!("{{\"length\":{length}}}")))
    }
}

export_stage!(VerifyAfterPublish);
