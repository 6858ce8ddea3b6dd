//! The output contract: what a stage returns is checked against its
//! manifest and limits before anything is stored.

use super::{EffectiveLimits, ExecError, Payload, Proposal};
use crate::manifest::PluginManifest;

/// Longest media type an output may carry, in bytes.
const MAX_MEDIA_TYPE: usize = 255;

pub(super) fn check_outputs(
    manifest: &PluginManifest,
    limits: &EffectiveLimits,
    outputs: Vec<Proposal>,
) -> Result<Vec<Payload>, ExecError> {
    let max = limits.max_output_bytes;
    let mut total = 0u64;
    let mut seen = std::collections::BTreeSet::new();
    for o in &outputs {
        // Names and media types are the plugin's text: quoted escaped and
        // bounded, never as given.
        let quoted = |s: &str| crate::text::bounded(s, 64);
        if !manifest.outputs.contains(&o.name) {
            return Err(ExecError::Contract(format!(
                "output `{}` is not declared (declared: [{}])",
                quoted(&o.name),
                manifest.outputs.join(", ")
            )));
        }
        if !seen.insert(o.name.as_str()) {
            return Err(ExecError::Contract(format!(
                "output `{}` was returned twice",
                o.name
            )));
        }
        if o.media_type.len() > MAX_MEDIA_TYPE || o.media_type.chars().any(char::is_control) {
            return Err(ExecError::Contract(format!(
                "output `{}` has media type `{}` ({} bytes); a media type is at most {MAX_MEDIA_TYPE} bytes with no control characters",
                o.name,
                quoted(&o.media_type),
                o.media_type.len()
            )));
        }
        total += (o.bytes.len() + o.media_type.len()) as u64;
    }
    if let Some(missing) = manifest.outputs.iter().find(|n| !seen.contains(n.as_str())) {
        return Err(ExecError::Contract(format!(
            "declared output `{missing}` was not returned"
        )));
    }
    if total > max {
        return Err(ExecError::Contract(format!(
            "outputs total {total} bytes with their media types, over the {max}-byte limit (raise limits.max_output_bytes)"
        )));
    }
    Ok(outputs
        .into_iter()
        .map(|o| Payload::new(o.name, o.media_type, o.bytes))
        .collect())
}
