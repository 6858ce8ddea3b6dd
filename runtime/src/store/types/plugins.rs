//! What the registry stores and reads: components, versions and the keys
//! that order them.

use serde::Serialize;

#[derive(Debug, Clone)]
pub struct PluginPut {
    pub digest: String,
    pub name: String,
    pub version: String,
    pub manifest: String,
    pub component: Vec<u8>,
    /// The version of Ratchet's contract the component speaks (`0.2.0`).
    pub contract: String,
    pub now: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginPutOutcome {
    Inserted,
    AlreadyPresent,
}

#[derive(Debug, Clone)]
pub struct PluginRecord {
    pub summary: PluginSummary,
    pub component: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PluginSummary {
    pub digest: String,
    pub name: String,
    pub version: String,
    pub manifest: String,
    pub size: i64,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub registered_at: i64,
    pub yanked: bool,
    /// The version of Ratchet's contract the component speaks (`0.2.0`).
    pub contract: String,
}

/// One registered version, without its manifest or component: what
/// resolving a requirement reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginVersion {
    pub digest: String,
    pub name: String,
    pub version: semver::Version,
    pub yanked: bool,
}

/// A key that sorts like semver precedence down to the pre-release: the
/// three numbers zero-padded to 20 digits (every `u64`), then `1` for a
/// release or `0` for a pre-release (which sorts below its release).
/// Pre-releases of one version share a key; build metadata is ignored.
pub fn version_key(v: &semver::Version) -> String {
    triple_key((v.major, v.minor, v.patch), v.pre.is_empty())
}

fn triple_key((major, minor, patch): (u64, u64, u64), release: bool) -> String {
    format!("{major:020}{minor:020}{patch:020}{}", u8::from(release))
}

/// The [`version_key`]s a requirement can match, a superset cut at
/// major.minor.patch: what [`Catalog::plugin_candidates`](crate::store::Catalog)
/// walks, highest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionKeyRange {
    pub lowest: String,
    pub highest: String,
    /// No comparator names a pre-release, so none can match (semver).
    pub releases_only: bool,
}

impl VersionKeyRange {
    pub fn of(req: &semver::VersionReq) -> Self {
        const ALL: ((u64, u64, u64), (u64, u64, u64)) = ((0, 0, 0), (u64::MAX, u64::MAX, u64::MAX));
        let (mut lowest, mut highest) = ALL;
        for c in &req.comparators {
            let (low, high) = comparator_range(c);
            lowest = lowest.max(low);
            highest = highest.min(high);
        }
        Self {
            lowest: triple_key(lowest, false),
            highest: triple_key(highest, true),
            releases_only: req.comparators.iter().all(|c| c.pre.is_empty()),
        }
    }
}

/// The major.minor.patch triples one comparator can match, inclusive.
fn comparator_range(c: &semver::Comparator) -> ((u64, u64, u64), (u64, u64, u64)) {
    use semver::Op;
    const MAX: u64 = u64::MAX;
    let (major, minor, patch) = (c.major, c.minor, c.patch);
    let floor = (major, minor.unwrap_or(0), patch.unwrap_or(0));
    let ceiling = (major, minor.unwrap_or(MAX), patch.unwrap_or(MAX));
    match c.op {
        Op::Exact | Op::Wildcard => (floor, ceiling),
        Op::Greater | Op::GreaterEq => (floor, (MAX, MAX, MAX)),
        Op::Less | Op::LessEq => ((0, 0, 0), ceiling),
        Op::Tilde => (floor, (major, minor.unwrap_or(MAX), MAX)),
        Op::Caret => match (major, minor, patch) {
            (0, Some(0), Some(patch)) => (floor, (0, 0, patch)),
            (0, Some(minor), _) => (floor, (0, minor, MAX)),
            (0, None, _) => (floor, (0, MAX, MAX)),
            (major, _, _) => (floor, (major, MAX, MAX)),
        },
        // An operator this code does not know: every version.
        _ => ((0, 0, 0), (MAX, MAX, MAX)),
    }
}
