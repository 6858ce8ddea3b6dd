//! NATS JetStream sinks: each event published on a subject built from it,
//! with `Nats-Msg-Id` set to its dedup key, and delivered only once the
//! stream acknowledged it. A redelivery inside the stream's duplicate
//! window is acknowledged as a duplicate and stored once.

use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use tokio::sync::OnceCell;

use super::Sent;

/// One JetStream sink's connection, made on its first use.
#[derive(Debug)]
pub(super) struct Nats {
    url: String,
    subject: SubjectTemplate,
    /// The stream to create on start, with its duplicate window.
    create: Option<(String, Duration)>,
    timeout: Duration,
    context: OnceCell<jetstream::Context>,
}

impl Nats {
    pub(super) fn new(
        url: &str,
        subject: SubjectTemplate,
        create: Option<(String, Duration)>,
        timeout: Duration,
    ) -> Self {
        Self {
            url: url.to_string(),
            subject,
            create,
            timeout,
            context: OnceCell::new(),
        }
    }

    /// Connects, and creates the stream when the file asks for it. Until
    /// this succeeds, every send tries it again (and is retried).
    pub(super) async fn connect(&self) -> Result<&jetstream::Context, String> {
        self.context
            .get_or_try_init(|| async {
                let client = async_nats::ConnectOptions::new()
                    .connection_timeout(self.timeout)
                    .connect(&self.url)
                    .await
                    .map_err(|e| format!("cannot connect to {}: {e}", self.url))?;
                let context = jetstream::ContextBuilder::new()
                    .timeout(self.timeout)
                    .build(client);
                if let Some((name, window)) = &self.create {
                    let config = stream::Config {
                        name: name.clone(),
                        subjects: vec![self.subject.wildcard()],
                        duplicate_window: *window,
                        ..Default::default()
                    };
                    let mut stream = context
                        .get_or_create_stream(config)
                        .await
                        .map_err(|e| format!("cannot create stream `{name}`: {e}"))?;
                    if let Ok(info) = stream.info().await
                        && info.config.duplicate_window < *window
                    {
                        tracing::warn!(
                            stream = name,
                            "the stream exists with a duplicate window of {:?}, shorter than the {:?} the sinks file asks for: a redelivery after it is stored twice",
                            info.config.duplicate_window,
                            window
                        );
                    }
                }
                Ok(context)
            })
            .await
    }

    /// Publishes `body` as event `id` (`event` of `run`) and waits for the
    /// stream's acknowledgement.
    pub(super) async fn send(&self, id: &str, event: &str, run: &str, body: Vec<u8>) -> Sent {
        let context = match self.connect().await {
            Ok(context) => context,
            Err(error) => return Sent::retry(None, error),
        };
        let subject = self.subject.render(event, run);
        if !subject_is_valid(&subject) {
            return Sent::Refused {
                status: None,
                error: format!("`{subject}` is not a NATS subject; change the sink's `subject`"),
            };
        }
        let publish = jetstream::message::PublishMessage::build()
            .payload(body.into())
            .message_id(id);
        let acked = match context.send_publish(subject.clone(), publish).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) => Sent::Delivered {
                status: None,
                duplicate: ack.duplicate,
            },
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => Sent::Refused {
                status: None,
                error: format!("publishing on `{subject}`: {e}"),
            },
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => Sent::retry(
                None,
                format!(
                    "no JetStream stream takes `{subject}`; create one or set create_stream = true"
                ),
            ),
            Err(e) => Sent::retry(None, format!("publishing on `{subject}`: {e}")),
        }
    }
}

/// A subject with `{event}` and `{run}` in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectTemplate(String);

/// The placeholders a subject may hold.
const PLACEHOLDERS: [&str; 2] = ["{event}", "{run}"];

impl SubjectTemplate {
    /// Checks that `text` is a subject once its placeholders are filled.
    pub fn parse(text: &str) -> Result<Self, String> {
        let sample = Self(text.to_string()).render("e.x", "r");
        if sample.contains(['{', '}']) {
            return Err(format!(
                "`{text}` holds a placeholder other than {}",
                PLACEHOLDERS.join(", ")
            ));
        }
        if !subject_is_valid(&sample) {
            return Err(format!(
                "`{text}` is not a NATS subject (tokens of letters, digits, `-`, `_` between dots, no wildcards)"
            ));
        }
        Ok(Self(text.to_string()))
    }

    fn render(&self, event: &str, run: &str) -> String {
        self.0.replace("{event}", event).replace("{run}", run)
    }

    /// The subjects a created stream takes: the template up to its first
    /// placeholder, then `>` (an event name may span several tokens).
    pub fn wildcard(&self) -> String {
        match self.0.find('{') {
            Some(at) => format!("{}>", &self.0[..at]),
            None => self.0.clone(),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn subject_is_valid(subject: &str) -> bool {
    subject.len() <= 1024
        && subject.split('.').all(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_template_is_filled_and_its_stream_takes_what_it_fills() {
        let t = SubjectTemplate::parse("ratchet.{event}").expect("valid");
        assert_eq!(t.render("draft.published", "r1"), "ratchet.draft.published");
        assert_eq!(t.wildcard(), "ratchet.>");
        let t = SubjectTemplate::parse("runs.{run}.{event}").expect("valid");
        assert_eq!(t.wildcard(), "runs.>");
        assert_eq!(
            SubjectTemplate::parse("fixed.subject")
                .expect("valid")
                .wildcard(),
            "fixed.subject"
        );
        for bad in [
            "ratchet.{evnt}",
            "ratchet.*",
            "ratchet..{event}",
            "a b.{event}",
            "ratchet.>",
        ] {
            assert!(SubjectTemplate::parse(bad).is_err(), "{bad}");
        }
    }
}
