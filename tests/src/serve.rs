//! A real `ratchet serve` process on 127.0.0.1, and a reqwest client that
//! carries its token: what the HTTP API's and the dashboard's tests talk
//! to.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{BOUND, ratchet};

/// The token every served test API asks for.
pub const TOKEN: &str = "s3cret-test-token";

/// A `ratchet serve` process (killed when dropped) and its base URL.
pub struct Served {
    _child: tokio::process::Child,
    pub base: String,
    pub http: reqwest::Client,
}

impl Served {
    /// Starts `bin serve` on the database at `url`, on a free port, with
    /// [`TOKEN`], and waits for it to say where it listens.
    pub async fn start(bin: &str, url: &str) -> Self {
        let mut cmd = ratchet(bin, url);
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .env("RATCHET_API_TOKEN", TOKEN)
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ratchet serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(BOUND, lines.next_line())
            .await
            .expect("serve said where it listens within the bound")
            .expect("read stdout")
            .expect("a line");
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        Self {
            _child: child,
            base: addr.to_string(),
            http: reqwest::Client::new(),
        }
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
    }
}
