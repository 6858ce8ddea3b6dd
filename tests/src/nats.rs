//! The NATS server with JetStream the relay's tests publish to.

use async_nats::jetstream;

/// The server the NATS tests use: `RATCHET_TEST_NATS`, or the project
/// machines' default; `off` skips them (never under `CI=true`).
pub fn nats_url() -> Option<String> {
    match std::env::var("RATCHET_TEST_NATS") {
        Ok(url) if url == "off" => None,
        Ok(url) => Some(url),
        Err(_) => Some(DEFAULT_NATS.to_string()),
    }
}

const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";

/// A JetStream context on the test server and its URL, or `None` (with a
/// note on stderr) when no server is reachable here. Under `CI=true` an
/// unreachable server is a failure, never a skip.
pub async fn jetstream() -> Option<(String, jetstream::Context)> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let Some(url) = nats_url() else {
        assert!(!ci, "RATCHET_TEST_NATS=off is not allowed in CI");
        eprintln!("skipping a NATS test: RATCHET_TEST_NATS=off");
        return None;
    };
    let options =
        async_nats::ConnectOptions::new().connection_timeout(std::time::Duration::from_secs(5));
    match options.connect(&url).await {
        Ok(client) => Some((url, jetstream::new(client))),
        Err(e) if !ci => {
            eprintln!(
                "skipping a NATS test: cannot connect to {url} ({e}); set RATCHET_TEST_NATS=nats://HOST:PORT to run it"
            );
            None
        }
        Err(e) => panic!("CI=true and NATS at {url} is unreachable: {e}"),
    }
}

/// Every message of `stream`, in its order: (subject, `Nats-Msg-Id`, body).
pub async fn stream_messages(
    js: &jetstream::Context,
    stream: &str,
) -> Vec<(String, String, Vec<u8>)> {
    let stream = js.get_stream(stream).await.expect("the stream exists");
    let last = stream
        .get_info()
        .await
        .expect("stream info")
        .state
        .last_sequence;
    let mut messages = Vec::new();
    for seq in 1..=last {
        let Ok(m) = stream.get_raw_message(seq).await else {
            continue;
        };
        let id = m
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        messages.push((m.subject.to_string(), id, m.payload.to_vec()));
    }
    messages
}
