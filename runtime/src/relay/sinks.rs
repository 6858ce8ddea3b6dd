//! The sinks file: where committed events go (see docs/relay.md). Strict
//! like every file Ratchet reads: an unknown field, a field of another
//! sink type, or a bad value is an error naming the file and line.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::nats::SubjectTemplate;
use crate::manifest::{ManifestError, Source};
use crate::scheduler::Backoff;
pub use crate::store::EventPattern;
use crate::store::SinkRoute;

/// Attempts a delivery gets before it is a dead letter, unless the file says.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 12;
/// How long a delivery is retried before it is a dead letter, unless the
/// file says: one day.
pub const DEFAULT_MAX_AGE_S: u64 = 24 * 60 * 60;
/// A webhook request's timeout, or how long a JetStream acknowledgement is
/// waited for, unless the file says.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// A created stream's duplicate window, unless the file says: twice the
/// sink's `max_age_s`, so that every retry of a delivery falls inside it.
pub const DUPLICATE_WINDOW_PER_MAX_AGE: u64 = 2;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    sink: Vec<Spanned<RawSink>>,
}

/// Every field any sink type takes; which belong to which type is checked
/// after parsing, so that the error can say so.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSink {
    name: Spanned<String>,
    #[serde(rename = "type")]
    kind: Spanned<String>,
    events: Spanned<Vec<Spanned<String>>>,
    max_attempts: Option<Spanned<u32>>,
    max_age_s: Option<Spanned<u64>>,
    backoff_ms: Option<Spanned<u64>>,
    max_backoff_ms: Option<Spanned<u64>>,
    url: Option<Spanned<String>>,
    timeout_ms: Option<Spanned<u64>>,
    // webhook
    secret_env: Option<Spanned<String>>,
    // nats
    stream: Option<Spanned<String>>,
    subject: Option<Spanned<String>>,
    create_stream: Option<Spanned<bool>>,
    duplicate_window_s: Option<Spanned<u64>>,
}

/// The sinks an operator configured, in the file's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sinks {
    pub sinks: Vec<SinkConfig>,
}

/// One sink: what it is, which events it takes and how it is retried.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkConfig {
    pub name: String,
    pub kind: SinkKind,
    pub events: Vec<EventPattern>,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub backoff: Backoff,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkKind {
    /// POST the event, signed the Standard Webhooks way.
    Webhook {
        url: String,
        /// The environment variable holding the `whsec_` secret.
        secret_env: String,
        timeout: Duration,
    },
    /// Publish the event to NATS JetStream with `Nats-Msg-Id` set to its
    /// dedup key.
    Nats {
        url: String,
        subject: SubjectTemplate,
        /// The stream to create on start, with its duplicate window.
        create_stream: Option<(String, Duration)>,
        /// How long the stream's acknowledgement is waited for.
        timeout: Duration,
    },
}

impl SinkKind {
    /// How long one send may take.
    pub fn timeout(&self) -> Duration {
        match self {
            Self::Webhook { timeout, .. } | Self::Nats { timeout, .. } => *timeout,
        }
    }
}

impl SinkConfig {
    /// What routing gives this sink: the events its patterns match.
    pub fn route(&self) -> SinkRoute {
        SinkRoute {
            sink: self.name.clone(),
            events: self.events.clone(),
        }
    }
}

impl Sinks {
    /// What routing gives each sink of the file.
    pub fn routes(&self) -> Vec<SinkRoute> {
        self.sinks.iter().map(SinkConfig::route).collect()
    }

    /// Parses a sinks file; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ManifestError> {
        let src = Source { file, text };
        let raw: RawFile = src.parse().map_err(|mut e| {
            if e.message.contains("expected a sequence") {
                e.message += "; write each sink as a [[sink]] table";
            }
            e
        })?;
        let mut names = BTreeSet::new();
        let mut sinks = Vec::with_capacity(raw.sink.len());
        for sink in &raw.sink {
            let config = sink_config(&src, sink.get_ref())?;
            if !names.insert(config.name.clone()) {
                return Err(src.at(
                    &sink.get_ref().name,
                    format!(
                        "sink `{}` is named twice; give each [[sink]] its own name",
                        config.name
                    ),
                ));
            }
            sinks.push(config);
        }
        Ok(Self { sinks })
    }

    pub fn names(&self) -> Vec<String> {
        self.sinks.iter().map(|s| s.name.clone()).collect()
    }
}

fn sink_config(src: &Source<'_>, raw: &RawSink) -> Result<SinkConfig, ManifestError> {
    let name = raw.name.get_ref();
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !name_ok {
        return Err(src.at(
            &raw.name,
            format!("sink name `{name}` is not valid (1 to 64 of a-z, 0-9, `-`, `_`)"),
        ));
    }
    let events = raw.events.get_ref();
    if events.is_empty() {
        return Err(src.at(
            &raw.events,
            format!(
                "sink `{name}` takes no events; list the event names it takes, e.g. events = [\"*\"]"
            ),
        ));
    }
    let mut patterns = Vec::with_capacity(events.len());
    for pattern in events {
        let text = pattern.get_ref();
        let Some(parsed) = EventPattern::parse(text) else {
            return Err(src.at(
                pattern,
                format!(
                    "event pattern `{text}` is not valid (event names with `*` for any run of characters, e.g. \"draft.*\")"
                ),
            ));
        };
        patterns.push(parsed);
    }
    let kind = match raw.kind.get_ref().as_str() {
        "webhook" => webhook(src, raw)?,
        "nats" => nats(src, raw)?,
        other => {
            return Err(src.at(
                &raw.kind,
                format!("sink `{name}` has type `{other}`; the types are `webhook` and `nats`"),
            ));
        }
    };
    let positive = |field: &Option<Spanned<u64>>, what: &str| match field {
        Some(v) if *v.get_ref() == 0 => {
            Err(src.at(v, format!("`{what}` is 0; it must be at least 1")))
        }
        _ => Ok(()),
    };
    positive(&raw.max_age_s, "max_age_s")?;
    positive(&raw.backoff_ms, "backoff_ms")?;
    positive(&raw.max_backoff_ms, "max_backoff_ms")?;
    positive(&raw.timeout_ms, "timeout_ms")?;
    if let Some(attempts) = &raw.max_attempts
        && *attempts.get_ref() == 0
    {
        return Err(src.at(attempts, "`max_attempts` is 0; it must be at least 1"));
    }
    let base = raw.backoff_ms.as_ref().map_or(1_000, |v| *v.get_ref());
    let max = raw
        .max_backoff_ms
        .as_ref()
        .map_or(base.max(5 * 60 * 1_000), |v| *v.get_ref());
    if max < base {
        let at = raw.max_backoff_ms.as_ref().map(Spanned::span);
        return Err(src.error(
            at,
            format!("`max_backoff_ms` ({max}) is below `backoff_ms` ({base}); raise it"),
        ));
    }
    Ok(SinkConfig {
        name: name.clone(),
        kind,
        events: patterns,
        max_attempts: raw
            .max_attempts
            .as_ref()
            .map_or(DEFAULT_MAX_ATTEMPTS, |v| *v.get_ref()),
        max_age: Duration::from_secs(
            raw.max_age_s
                .as_ref()
                .map_or(DEFAULT_MAX_AGE_S, |v| *v.get_ref()),
        ),
        backoff: Backoff {
            base_ms: i64::try_from(base).unwrap_or(i64::MAX),
            max_ms: i64::try_from(max).unwrap_or(i64::MAX),
            jitter: 0.2,
        },
    })
}

fn webhook(src: &Source<'_>, raw: &RawSink) -> Result<SinkKind, ManifestError> {
    let name = raw.name.get_ref();
    foreign(
        src,
        raw,
        &[
            ("stream", raw.stream.as_ref().map(Spanned::span)),
            ("subject", raw.subject.as_ref().map(Spanned::span)),
            (
                "create_stream",
                raw.create_stream.as_ref().map(Spanned::span),
            ),
            (
                "duplicate_window_s",
                raw.duplicate_window_s.as_ref().map(Spanned::span),
            ),
        ],
    )?;
    let Some(url) = &raw.url else {
        return Err(src.at(
            &raw.name,
            format!("webhook sink `{name}` has no `url`; add url = \"https://…\""),
        ));
    };
    match reqwest::Url::parse(url.get_ref()) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
        _ => {
            return Err(src.at(
                url,
                format!(
                    "`{}` is not an http(s) URL; write e.g. url = \"https://hooks.example.com/events\"",
                    url.get_ref()
                ),
            ));
        }
    }
    let Some(secret_env) = &raw.secret_env else {
        return Err(src.at(
            &raw.name,
            format!(
                "webhook sink `{name}` has no `secret_env`; name the environment variable that holds its `whsec_` secret"
            ),
        ));
    };
    let var = secret_env.get_ref();
    if var.starts_with("whsec_") {
        return Err(src.at(
            secret_env,
            "`secret_env` holds a secret; put the secret in an environment variable and name that variable here (e.g. secret_env = \"HOOKS_SECRET\")",
        ));
    }
    if var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(src.at(
            secret_env,
            format!("`secret_env` is `{var}`; it names an environment variable (A-Z, 0-9, `_`)"),
        ));
    }
    Ok(SinkKind::Webhook {
        url: url.get_ref().clone(),
        secret_env: var.clone(),
        timeout: timeout(raw),
    })
}

fn timeout(raw: &RawSink) -> Duration {
    Duration::from_millis(
        raw.timeout_ms
            .as_ref()
            .map_or(DEFAULT_TIMEOUT_MS, |v| *v.get_ref()),
    )
}

/// A field of one sink type found on a sink of another.
fn foreign(
    src: &Source<'_>,
    raw: &RawSink,
    fields: &[(&str, Option<std::ops::Range<usize>>)],
) -> Result<(), ManifestError> {
    let kind = raw.kind.get_ref();
    match fields.iter().find(|(_, span)| span.is_some()) {
        Some((field, span)) => Err(src.error(
            span.clone(),
            format!("`{field}` is not a field of a `{kind}` sink; remove it"),
        )),
        None => Ok(()),
    }
}

fn nats(src: &Source<'_>, raw: &RawSink) -> Result<SinkKind, ManifestError> {
    let name = raw.name.get_ref();
    foreign(
        src,
        raw,
        &[("secret_env", raw.secret_env.as_ref().map(Spanned::span))],
    )?;
    let Some(url) = &raw.url else {
        return Err(src.at(
            &raw.name,
            format!("nats sink `{name}` has no `url`; add url = \"nats://127.0.0.1:4222\""),
        ));
    };
    match reqwest::Url::parse(url.get_ref()) {
        Ok(u) if matches!(u.scheme(), "nats" | "tls") && u.host().is_some() => {}
        _ => {
            return Err(src.at(
                url,
                format!(
                    "`{}` is not a NATS URL; write e.g. url = \"nats://127.0.0.1:4222\"",
                    url.get_ref()
                ),
            ));
        }
    }
    let Some(subject) = &raw.subject else {
        return Err(src.at(
            &raw.name,
            format!(
                "nats sink `{name}` has no `subject`; add e.g. subject = \"ratchet.{{event}}\""
            ),
        ));
    };
    let template = SubjectTemplate::parse(subject.get_ref()).map_err(|why| {
        src.at(
            subject,
            format!("{why}; write e.g. subject = \"ratchet.{{event}}\""),
        )
    })?;
    let create = raw.create_stream.as_ref().is_some_and(|c| *c.get_ref());
    let stream = match (&raw.stream, create) {
        (Some(stream), _) => {
            let text = stream.get_ref();
            let ok = !text.is_empty()
                && text.len() <= 255
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !ok {
                return Err(src.at(
                    stream,
                    format!("stream name `{text}` is not valid (letters, digits, `-`, `_`)"),
                ));
            }
            Some(text.clone())
        }
        (None, true) => {
            return Err(src.at(
                &raw.name,
                format!(
                    "nats sink `{name}` has create_stream = true but no `stream`; name the stream, e.g. stream = \"RATCHET\""
                ),
            ));
        }
        (None, false) => None,
    };
    let max_age_s = raw
        .max_age_s
        .as_ref()
        .map_or(DEFAULT_MAX_AGE_S, |v| *v.get_ref());
    let window_s = match &raw.duplicate_window_s {
        Some(window) if !create => {
            return Err(src.at(
                window,
                "`duplicate_window_s` applies to a stream the relay creates; set create_stream = true or remove it",
            ));
        }
        Some(window) if *window.get_ref() < max_age_s => {
            return Err(src.at(
                window,
                format!(
                    "`duplicate_window_s` ({}) is below the sink's `max_age_s` ({max_age_s}): a retry after the window would be stored twice; raise it",
                    window.get_ref()
                ),
            ));
        }
        Some(window) => *window.get_ref(),
        None => max_age_s.saturating_mul(DUPLICATE_WINDOW_PER_MAX_AGE),
    };
    Ok(SinkKind::Nats {
        url: url.get_ref().clone(),
        subject: template,
        create_stream: stream
            .filter(|_| create)
            .map(|s| (s, Duration::from_secs(window_s))),
        timeout: timeout(raw),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_any_run_of_characters_at_its_stars() {
        let p = |s: &str| EventPattern::parse(s).expect("a pattern");
        assert!(p("*").matches("draft.published"));
        assert!(p("draft.*").matches("draft.published"));
        assert!(!p("draft.*").matches("drafts.published"));
        assert!(!p("draft.*").matches("run.failed"));
        assert!(p("run.failed").matches("run.failed"));
        assert!(!p("run.failed").matches("run.failed.twice"));
        assert!(p("*.failed").matches("run.failed"));
        assert!(p("a*b*c").matches("a-x-b-y-c"));
        assert!(!p("a*b*c").matches("a-x-c-y-b"));
    }

    #[test]
    fn a_file_of_webhook_sinks_parses_with_its_defaults() {
        let text = "[[sink]]\nname = \"hooks\"\ntype = \"webhook\"\nurl = \"http://127.0.0.1:9000/events\"\nsecret_env = \"HOOKS_SECRET\"\nevents = [\"*\"]\n";
        let sinks = Sinks::parse("sinks.toml", text).expect("parses");
        let hooks = &sinks.sinks[0];
        assert_eq!(hooks.name, "hooks");
        assert_eq!(hooks.max_attempts, DEFAULT_MAX_ATTEMPTS);
        assert!(hooks.route().takes("draft.published"));
        assert_eq!(
            hooks.kind,
            SinkKind::Webhook {
                url: "http://127.0.0.1:9000/events".into(),
                secret_env: "HOOKS_SECRET".into(),
                timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
            }
        );
    }
}
