//! What the fuzz targets share: the rule every refusal keeps (one clear
//! line), and `plugin add`'s checks on a host of their own.

use std::sync::{Arc, Mutex};

use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::llm::StochasticModel;
use ratchet_runtime::plugin::{HostConfig, PluginHost};

/// A refusal is one line a person can read: not empty, no line break, no
/// control character (a terminal escape from the input included).
pub fn assert_one_clear_line(what: &str, message: &str) {
    assert!(!message.is_empty(), "{what}: an empty error");
    assert!(
        !message.chars().any(char::is_control),
        "{what}: not one clean line: {message:?}"
    );
}

/// `plugin add`'s checks (compile, the `stage` world, `describe`, the
/// policy) on a host with a store of its own. The host keeps each component
/// it admitted compiled, so it is replaced every [`Admission::FRESH_EVERY`]
/// inputs: a long run's memory stays flat.
pub struct Admission {
    runtime: tokio::runtime::Runtime,
    host: Mutex<(usize, Arc<PluginHost>)>,
    _dir: tempfile::TempDir,
    url: String,
}

impl Admission {
    const FRESH_EVERY: usize = 200;

    pub fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let dir = tempfile::tempdir().expect("a temporary folder");
        let url = format!("sqlite://{}", dir.path().join("fuzz.db").display());
        let host = runtime.block_on(Self::host(&url));
        Self {
            runtime,
            host: Mutex::new((0, host)),
            _dir: dir,
            url,
        }
    }

    async fn host(url: &str) -> Arc<PluginHost> {
        let store = ratchet_runtime::store::open(url)
            .await
            .expect("a SQLite store");
        let host = PluginHost::new(
            store,
            Arc::new(StochasticModel),
            Arc::new(SystemClock),
            HostConfig::default(),
        )
        .expect("a plugin host");
        Arc::new(host)
    }

    /// Admits `bytes` as `plugin add` would: admitted, or refused in one
    /// clear line; a panic is a finding.
    pub fn check(&self, bytes: &[u8]) {
        let host = {
            let mut slot = self.host.lock().unwrap_or_else(|e| e.into_inner());
            slot.0 += 1;
            if slot.0 % Self::FRESH_EVERY == 0 {
                slot.1 = self.runtime.block_on(Self::host(&self.url));
            }
            slot.1.clone()
        };
        if let Err(e) = self.runtime.block_on(host.admit(bytes)) {
            assert_one_clear_line("component", &e.to_string());
        }
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new()
    }
}
