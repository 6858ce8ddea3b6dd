//! Host patterns for outgoing HTTP: the manifest's `allowed_hosts` and the
//! policy's `[http] allowed_hosts`. A request goes out only when both allow
//! its host and port.
//!
//! A pattern is `HOST[:PORT]`. `HOST` is a name or an IP address (IPv6 in
//! brackets), `*.example.com` (any subdomain, not `example.com` itself), or
//! `*` (any host). Without `:PORT` only the scheme's default port (80, 443)
//! is allowed; `:*` allows any port.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HostPart {
    Any,
    /// `*.suffix`: the suffix with its leading dot.
    Subdomain(String),
    Exact(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PortPart {
    Default,
    Any,
    Exact(u16),
}

/// One allowed `HOST[:PORT]` (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPattern {
    host: HostPart,
    port: PortPart,
}

impl HostPattern {
    /// Whether a request to `host:port` (`https` or not) is allowed.
    pub fn allows(&self, host: &str, port: Option<u16>, https: bool) -> bool {
        let host = host.to_ascii_lowercase();
        let host_ok = match &self.host {
            HostPart::Any => true,
            HostPart::Subdomain(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
            HostPart::Exact(name) => *name == host,
        };
        let default = if https { 443 } else { 80 };
        let port = port.unwrap_or(default);
        let port_ok = match self.port {
            PortPart::Any => true,
            PortPart::Default => port == default,
            PortPart::Exact(p) => port == p,
        };
        host_ok && port_ok
    }
}

/// Whether any of `patterns` allows the request.
pub fn any_allows(patterns: &[HostPattern], host: &str, port: Option<u16>, https: bool) -> bool {
    patterns.iter().any(|p| p.allows(host, port, https))
}

impl FromStr for HostPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "host pattern `{text}` {why}; write HOST[:PORT], e.g. \"api.example.com\", \"*.wikipedia.org:443\" or \"127.0.0.1:*\""
            )
        };
        if text.contains('/') {
            return Err(bad("is a URL, not a host (no scheme, no path)"));
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (v6, after) = rest
                .split_once(']')
                .ok_or_else(|| bad("opens a `[` it does not close"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("has text after `]`"))?,
                ),
            };
            (format!("[{v6}]"), port)
        } else {
            match text.rsplit_once(':') {
                Some((host, port)) => (host.to_string(), Some(port)),
                None => (text.to_string(), None),
            }
        };
        let port = match port {
            None => PortPart::Default,
            Some("*") => PortPart::Any,
            Some(p) => PortPart::Exact(
                p.parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("has a port that is not 1 to 65535 or `*`"))?,
            ),
        };
        let host = host.to_ascii_lowercase();
        let label_ok = |name: &str| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        };
        let host = if host == "*" {
            HostPart::Any
        } else if let Some(suffix) = host.strip_prefix("*.") {
            if !label_ok(suffix) {
                return Err(bad("has no valid domain after `*.`"));
            }
            HostPart::Subdomain(format!(".{suffix}"))
        } else if host.starts_with('[') || label_ok(&host) {
            HostPart::Exact(host)
        } else {
            return Err(bad("is not a host name, an IP address, `*.DOMAIN` or `*`"));
        };
        Ok(Self { host, port })
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPart::Any => write!(f, "*")?,
            HostPart::Subdomain(suffix) => write!(f, "*{suffix}")?,
            HostPart::Exact(name) => write!(f, "{name}")?,
        }
        match self.port {
            PortPart::Default => Ok(()),
            PortPart::Any => write!(f, ":*"),
            PortPart::Exact(p) => write!(f, ":{p}"),
        }
    }
}

impl serde::Serialize for HostPattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for HostPattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> HostPattern {
        text.parse().expect("valid pattern")
    }

    /// Seen failing with `*.example.com` matching `example.com` and with a
    /// pattern without a port allowing any port.
    #[test]
    fn patterns_match_hosts_and_ports() {
        let sub = pattern("*.Wikipedia.org:443");
        assert!(sub.allows("en.wikipedia.org", None, true));
        assert!(sub.allows("EN.wikipedia.org", Some(443), true));
        assert!(!sub.allows("wikipedia.org", None, true));
        assert!(!sub.allows("evilwikipedia.org", None, true));
        assert!(!sub.allows("en.wikipedia.org", Some(8443), true));
        let exact = pattern("api.example.com");
        assert!(exact.allows("api.example.com", None, true));
        assert!(exact.allows("api.example.com", Some(80), false));
        assert!(!exact.allows("api.example.com", Some(8080), false));
        let local = pattern("127.0.0.1:*");
        assert!(local.allows("127.0.0.1", Some(39_001), false));
        assert!(!local.allows("127.0.0.2", Some(39_001), false));
        assert!(pattern("[::1]:8080").allows("[::1]", Some(8080), false));
        assert!(pattern("*").allows("anything.example", None, false));
        assert_eq!(pattern("*.a.org:*").to_string(), "*.a.org:*");
    }

    #[test]
    fn a_bad_pattern_says_what_to_write() {
        for bad in [
            "", "a b", "*.", "host:0", "host:x", "[::1", "[::1]x", "http://a",
        ] {
            let err = bad.parse::<HostPattern>().expect_err(bad);
            assert!(err.contains("write HOST[:PORT]"), "{bad}: {err}");
        }
    }
}
