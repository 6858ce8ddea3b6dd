//! The checks of one `[[stage]]` of a pipeline: what it runs (a plugin or
//! an approval gate), its input bindings against its plugin, its plugin
//! reference.

use toml::Spanned;

use super::pipeline::StageDecl;
use super::{ManifestError, PluginManifest, Source, check_name};

/// A stage names a plugin or is an approval gate, and only a gate takes
/// a timeout.
pub(super) fn check_work(src: &Source<'_>, stage: &StageDecl) -> Result<(), ManifestError> {
    let me = stage.name.get_ref();
    match (&stage.plugin, &stage.approve) {
        (Some(_), Some(approve)) => Err(src.at(
            approve,
            format!("stage `{me}` names a plugin and `approve`; a gate runs no plugin, so keep one of them"),
        )),
        (None, None) => Err(src.at(
            &stage.name,
            format!("stage `{me}` names no plugin; add `plugin = \"NAME@^1\"`, or `approve = \"what to check\"` for an approval gate"),
        )),
        (Some(_), None) => match &stage.timeout_s {
            Some(t) => Err(src.at(
                t,
                format!("stage `{me}` runs a plugin; `timeout_s` is for approval gates (limit a plugin's time in the operator policy)"),
            )),
            None => Ok(()),
        },
        (None, Some(approve)) => {
            if let Some(map) = &stage.map {
                return Err(src.at(
                    map,
                    format!("stage `{me}` is an approval gate; a gate is decided once, so it cannot be mapped over a list"),
                ));
            }
            if approve.get_ref().trim().is_empty() {
                return Err(src.at(approve, "`approve` must say what the approver checks"));
            }
            if let Some(t) = stage.timeout_s.as_ref().filter(|t| *t.get_ref() == 0) {
                return Err(src.at(t, "timeout_s must be at least 1 (leave it out to wait without limit)"));
            }
            match &stage.max_attempts {
                Some(m) => Err(src.at(m, format!("stage `{me}` is an approval gate: it is decided once, so it takes no max_attempts"))),
                None => Ok(()),
            }
        }
    }
}

/// Each binding names an input the plugin declares, and each it declares
/// is bound. A gate's inputs are what its approver is shown: any names.
pub(super) fn check_bindings(
    src: &Source<'_>,
    stage: &StageDecl,
    manifest: Option<&PluginManifest>,
) -> Result<(), ManifestError> {
    let me = stage.name.get_ref();
    let Some(manifest) = manifest else {
        for input in stage.inputs.keys() {
            check_name(src, input, "input name")?;
        }
        return Ok(());
    };
    for input in stage.inputs.keys() {
        if !manifest.inputs.contains(input.get_ref()) {
            return Err(src.at(
                input,
                format!(
                    "stage `{me}` binds input `{}`, but plugin `{}` declares inputs [{}]; remove the binding or fix its name",
                    input.get_ref(),
                    manifest.name,
                    manifest.inputs.join(", ")
                ),
            ));
        }
    }
    for declared in &manifest.inputs {
        if !stage.inputs.keys().any(|k| k.get_ref() == declared) {
            return Err(src.at(
                &stage.name,
                format!(
                    "stage `{me}` does not bind input `{declared}` that plugin `{}` needs; add `inputs = {{ {declared} = \"STAGE.OUTPUT\" }}`",
                    manifest.name
                ),
            ));
        }
    }
    Ok(())
}

pub(super) fn parse_plugin_ref(
    src: &Source<'_>,
    spec: &Spanned<String>,
) -> Result<(String, semver::VersionReq), ManifestError> {
    let text = spec.get_ref();
    let (name, req) = text.split_once('@').unwrap_or((text, "*"));
    if !super::is_valid_name(name) {
        return Err(src.at(
            spec,
            format!("plugin `{text}` must be written NAME@VERSION_REQ, e.g. \"draft@^1\""),
        ));
    }
    let req = semver::VersionReq::parse(req).map_err(|e| {
        src.at(spec, format!("version requirement `{req}` of plugin `{name}` is invalid ({e}); e.g. \"^1\" or \"=1.2.0\""))
    })?;
    Ok((name.to_string(), req))
}
