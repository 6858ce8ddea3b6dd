//! Hostile test plugin: `describe` returns another manifest on every call
//! (a random number in its description), so the manifest a worker would
//! read is not the one admitted at registration. It writes its own export
//! instead of using `export_stage!`, which always describes the same text.
use std::hash::{BuildHasher, Hasher};

use ratchet_plugin_sdk::bindings::{Artifact, Guest, StageContext, StageError};

struct ShiftyDescribe;

impl Guest for ShiftyDescribe {
    fn describe() -> String {
        // Seeded from the host's random source on every new instance.
        let nonce = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        include_str!("../plugin.toml")
            .replace("(this text is replaced)", &format!("(this time: {nonce})"))
    }

    fn run(_ctx: StageContext, _inputs: Vec<Artifact>) -> Result<Vec<Artifact>, StageError> {
        Ok(vec![Artifact {
            name: "out".into(),
            media_type: "text/plain".into(),
            bytes: b"ran".to_vec(),
        }])
    }
}

ratchet_plugin_sdk::bindings::__export_stage_world!(ShiftyDescribe);
