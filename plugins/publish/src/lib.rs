//! `publish`: the stage with an external effect. The effect itself is the
//! `draft.published` outbox event the host writes in the completion
//! transaction; the receipt names the digest of the draft that was published.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};
use sha2::{Digest, Sha256};

struct Publish;

impl Stage for Publish {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let draft = inputs.bytes("draft")?;
        let receipt = serde_json::json!({
            "draft_sha256": hex::encode(Sha256::digest(draft)),
            "idempotency_key": ctx.idempotency_key(),
        });
        Outputs::new().json("receipt", &receipt)
    }
}

export_stage!(Publish);
