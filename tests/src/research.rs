//! The research example's fixtures (`plugins/research.toml`), shared by the
//! HTTP capability's tests and the Python fetch stage's: a server that
//! counts requests and echoes the key it was sent, the pipeline, and a
//! policy that allows 127.0.0.1 and grants the `search` secret.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::get;

/// The environment variable the policies here read the `search` key from.
pub const SECRET_ENV: &str = "RATCHET_TEST_SEARCH_KEY";

/// A server that counts the requests it got and echoes the authorization
/// it was sent, in a header and in the body: what a careless API does.
/// `/page` is the page; `/big` is 4 KiB of `x`.
#[derive(Clone, Default)]
pub struct EchoServer {
    hits: Arc<AtomicU32>,
    /// The last `authorization` header it was sent.
    auth: Arc<Mutex<String>>,
}

impl EchoServer {
    /// Listens on every interface (so that 127.0.0.2 reaches it too);
    /// returns its address on 127.0.0.1.
    pub async fn start(&self) -> SocketAddr {
        let (hits, seen) = (self.hits.clone(), self.auth.clone());
        let page = move |headers: HeaderMap| {
            let (hits, seen) = (hits.clone(), seen.clone());
            async move {
                hits.fetch_add(1, Ordering::SeqCst);
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_string();
                seen.lock().expect("auth").clone_from(&auth);
                (
                    [
                        ("content-type", "text/plain".to_string()),
                        ("x-echo", auth.clone()),
                    ],
                    echoed(&auth),
                )
            }
        };
        let big = |_: HeaderMap| async { vec![b'x'; 4096] };
        let app = Router::new()
            .route("/page", get(page))
            .route("/big", get(big));
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    pub fn hits(&self) -> u32 {
        self.hits.load(Ordering::SeqCst)
    }

    /// The last `authorization` header it was sent.
    pub fn auth(&self) -> String {
        self.auth.lock().expect("auth").clone()
    }
}

/// The body `/page` answers to a request that sent `auth`.
pub fn echoed(auth: &str) -> String {
    format!("Ratchet journals every call. You sent: {auth}.")
}

/// `plugins/research.toml`, its fetch stage run by `fetch` (a plugin name).
pub fn pipeline(fetch: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/research.toml"))
        .expect("research.toml")
        .replace("research-fetch@^1", &format!("{fetch}@^1"))
}

/// A policy file in `dir` allowing 127.0.0.1 on any port and granting the
/// `search` secret (read from [`SECRET_ENV`]) to `fetch` alone.
pub fn policy(dir: &Path, fetch: &str) -> PathBuf {
    let path = dir.join("policy.toml");
    std::fs::write(
        &path,
        format!(
            "[http]\nallowed_hosts = [\"127.0.0.1:*\"]\n\n[secrets.search]\nenv = \"{SECRET_ENV}\"\nplugins = [\"{fetch}\"]\n"
        ),
    )
    .expect("write policy");
    path
}

/// A `ratchet worker` of binary `bin` on the database at `url` under
/// `policy`, working until idle one attempt at a time with a short lease,
/// the `search` key set to `secret`.
pub fn worker(
    bin: &str,
    url: &str,
    policy: &Path,
    id: &str,
    secret: &str,
) -> tokio::process::Command {
    let mut cmd = crate::ratchet(bin, url);
    cmd.arg("--policy")
        .arg(policy)
        .args(["worker", "--until-idle", "--concurrency", "1"])
        .args(["--lease-ms", "300", "--worker-id", id])
        .env(SECRET_ENV, secret);
    cmd
}
