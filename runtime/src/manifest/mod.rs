//! Plugin manifests and pipeline files: strict parsing, and errors that name
//! the file and line and say how to fix it.

mod hosts;
mod pipeline;
mod stages;

use std::fmt;

use serde::Deserialize;
use toml::Spanned;

use crate::text::escape_controls;

pub use hosts::{HostPattern, any_allows};
pub use pipeline::{
    Pipeline, Plan, PlannedStage, PlannedWork, PluginResolver, ResolvedPlugin, StageDecl,
};

/// A manifest or pipeline problem, located in its source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    pub file: String,
    /// 1-based; `None` when the problem has no single place.
    pub line: Option<usize>,
    pub message: String,
}

/// One line, whatever the document held: a name quoted in the message is
/// shown with its control characters escaped.
impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (file, message) = (escape_controls(&self.file), escape_controls(&self.message));
        match self.line {
            Some(line) => write!(f, "{file}:{line}: {message}"),
            None => write!(f, "{file}: {message}"),
        }
    }
}

/// Where a manifest came from and its text, to turn byte spans into lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl Source<'_> {
    pub fn error(
        &self,
        span: Option<std::ops::Range<usize>>,
        message: impl Into<String>,
    ) -> ManifestError {
        ManifestError {
            file: self.file.to_string(),
            line: span.map(|s| line_of(self.text, s.start)),
            message: message.into(),
        }
    }

    pub fn at<T>(&self, spanned: &Spanned<T>, message: impl Into<String>) -> ManifestError {
        self.error(Some(spanned.span()), message)
    }

    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, ManifestError> {
        toml::from_str(self.text).map_err(|e| {
            let message = e.message().trim().replace('\n', " ");
            self.error(e.span(), message)
        })
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// A host capability a plugin may ask for. An attempt may use it when its
/// manifest asks for it and the operator's policy grants it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    Log,
    Model,
    /// Outgoing HTTP through `wasi:http`, to the hosts both the manifest's
    /// `allowed_hosts` and the operator's policy allow.
    Http,
}

impl Capability {
    /// Every capability, in the order they are listed to operators.
    pub const ALL: [Capability; 3] = [Capability::Log, Capability::Model, Capability::Http];

    pub fn name(self) -> &'static str {
        match self {
            Capability::Log => "log",
            Capability::Model => "model",
            Capability::Http => "http",
        }
    }

    /// The WIT interface behind it; a component imports Ratchet's with the
    /// version of its contract (`ratchet:stage/model@0.2.0`), WASI's with
    /// WASI's version (`wasi:http/outgoing-handler@0.2.6`).
    pub fn interface(self) -> &'static str {
        match self {
            Capability::Log => "ratchet:stage/log",
            Capability::Model => "ratchet:stage/model",
            Capability::Http => "wasi:http/outgoing-handler",
        }
    }
}

/// Per-stage sandbox limits; unset fields take the host's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub timeout_ms: Option<u64>,
    pub memory_mb: Option<u64>,
    pub max_output_bytes: Option<u64>,
    /// Calls into the host (log, model, HTTP requests) per attempt.
    pub max_host_calls: Option<u64>,
    /// The largest HTTP response body (and request body) a call may carry.
    pub max_http_response_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    name: Spanned<String>,
    version: Spanned<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    inputs: Vec<Spanned<String>>,
    #[serde(default)]
    outputs: Vec<Spanned<String>>,
    #[serde(default)]
    after: Vec<Spanned<String>>,
    #[serde(default)]
    emits: Vec<Spanned<String>>,
    #[serde(default)]
    capabilities: Vec<Capability>,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    allowed_hosts: Vec<Spanned<String>>,
}

/// A validated plugin manifest (what `describe` returns).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PluginManifest {
    pub name: String,
    pub version: semver::Version,
    pub description: String,
    /// Artifact names the stage consumes.
    pub inputs: Vec<String>,
    /// Artifact names the stage must produce, all of them, nothing else.
    pub outputs: Vec<String>,
    /// Stages that must have succeeded first (ordering only).
    pub after: Vec<String>,
    /// Outbox events written when the stage completes.
    pub emits: Vec<String>,
    pub capabilities: Vec<Capability>,
    pub limits: Limits,
    /// Where the stage may send HTTP requests (with the `http`
    /// capability), if the operator's policy allows the host too.
    pub allowed_hosts: Vec<HostPattern>,
}

impl PluginManifest {
    /// Parses and validates manifest TOML; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ManifestError> {
        let src = Source { file, text };
        let raw: RawManifest = src.parse()?;
        check_name(&src, &raw.name, "plugin name")?;
        let version = semver::Version::parse(raw.version.get_ref()).map_err(|e| {
            src.at(
                &raw.version,
                format!(
                    "version `{}` is not semver ({e}); write it as MAJOR.MINOR.PATCH, e.g. \"1.0.0\"",
                    raw.version.get_ref()
                ),
            )
        })?;
        let mut seen = std::collections::BTreeSet::new();
        for (list, what) in [(&raw.inputs, "input"), (&raw.outputs, "output")] {
            for name in list {
                check_name(&src, name, what)?;
                if !seen.insert(name.get_ref().clone()) {
                    return Err(src.at(
                        name,
                        format!(
                            "`{}` is declared twice among inputs and outputs; names must be unique",
                            name.get_ref()
                        ),
                    ));
                }
            }
        }
        for name in &raw.after {
            check_name(&src, name, "`after` stage")?;
        }
        for event in &raw.emits {
            check_event(&src, event)?;
        }
        let mut allowed_hosts = Vec::with_capacity(raw.allowed_hosts.len());
        for pattern in &raw.allowed_hosts {
            allowed_hosts.push(pattern.get_ref().parse().map_err(|e| src.at(pattern, e))?);
        }
        if let Some(first) = raw.allowed_hosts.first()
            && !raw.capabilities.contains(&Capability::Http)
        {
            return Err(src.at(
                first,
                "`allowed_hosts` needs the `http` capability; add \"http\" to `capabilities`",
            ));
        }
        Ok(PluginManifest {
            name: raw.name.into_inner(),
            version,
            description: raw.description,
            inputs: raw.inputs.into_iter().map(Spanned::into_inner).collect(),
            outputs: raw.outputs.into_iter().map(Spanned::into_inner).collect(),
            after: raw.after.into_iter().map(Spanned::into_inner).collect(),
            emits: raw.emits.into_iter().map(Spanned::into_inner).collect(),
            capabilities: raw.capabilities,
            limits: raw.limits,
            allowed_hosts,
        })
    }
}

/// Names: lowercase letters, digits, `-` and `_`, starting with a letter.
pub(crate) fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name.len() <= 64
}

fn check_name(src: &Source<'_>, name: &Spanned<String>, what: &str) -> Result<(), ManifestError> {
    if is_valid_name(name.get_ref()) {
        Ok(())
    } else {
        Err(src.at(
            name,
            format!(
                "{what} `{}` is not a valid name (use lowercase letters, digits, `-` and `_`, starting with a letter)",
                name.get_ref()
            ),
        ))
    }
}

fn check_event(src: &Source<'_>, event: &Spanned<String>) -> Result<(), ManifestError> {
    if event.get_ref().split('.').all(is_valid_name) {
        Ok(())
    } else {
        Err(src.at(
            event,
            format!(
                "event `{}` is not a valid name (dot-separated names, e.g. \"draft.published\")",
                event.get_ref()
            ),
        ))
    }
}
