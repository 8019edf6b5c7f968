//! What every section's checks share: how bad a problem is, the problem, and how values are
//! shown in messages.

use std::fmt;
use std::time::Duration;

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Works, but probably not as meant.
    Warning,
    /// Works, but can lose or expose what it carries (a transport in clear, a source anyone
    /// can send to, a callback with no second chance): said at start, by `check-config` and
    /// in `/readyz`, so that nobody runs it unaware.
    AtRisk,
    /// The gateway refuses to start.
    Error,
}

/// One problem with one setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// How bad.
    pub severity: Severity,
    /// The setting, e.g. `dedup.retention`.
    pub setting: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::AtRisk => "at risk",
        };
        write!(f, "{label}: {}: {}", self.setting, self.message)
    }
}

pub(crate) fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// How a URL that is refused is named in messages: by its scheme, never with its credentials.
pub(crate) fn scheme_of(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, _)) => format!("a {:?} URL", scheme.chars().take(16).collect::<String>()),
        None => "the value (no scheme://)".to_owned(),
    }
}

/// `url` is `http://` to a host other than this machine: what goes to it travels in clear.
pub(crate) fn plain_http_off_host(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("ws://"))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    !(host == "localhost" || host == "::1" || host.starts_with("127."))
}
