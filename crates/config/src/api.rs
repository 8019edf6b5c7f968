//! `[api]` and its callers: the business-key and send API for handlers in any language.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checks::{Severity, human};
use crate::duration;
use crate::*;

/// `[api]`: business keys over HTTP for handlers in any language. Served only when a caller
/// is configured: it is never open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Where the API listens.
    pub listen: String,
    /// The longest lease a caller may take on a key.
    #[serde(with = "duration")]
    pub max_lease: Duration,
    /// The longest a claim may wait for another holder's result, and a send for its rate
    /// budget.
    #[serde(with = "duration")]
    pub max_wait: Duration,
    /// How long one call to a platform's API may take; past it the outcome is unknown.
    #[serde(with = "duration")]
    pub send_timeout: Duration,
    /// Sends that may wait for their rate budgets at once; more are answered 503.
    pub max_waiting_sends: usize,
    /// Who may call, each with a token of its own.
    #[serde(rename = "caller")]
    pub callers: Vec<CallerConfig>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9191".into(),
            max_lease: Duration::from_secs(3600),
            max_wait: Duration::from_secs(30),
            send_timeout: Duration::from_secs(10),
            max_waiting_sends: 1000,
            callers: Vec::new(),
        }
    }
}

/// `[[api.caller]]`: one caller of the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerConfig {
    /// The caller's name, for logs and metrics.
    pub name: String,
    /// Its bearer token.
    pub token: Secret,
    /// Callers of one namespace share their keys (a Python and a Node handler of one shop).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Sends per second this caller may make (its own budget, apart from the platforms');
    /// beyond it `/send` answers 429 with Retry-After at once. Unbounded unless set.
    #[serde(default)]
    pub sends_per_second: Option<u32>,
    /// Results of `/keys/complete` this caller may have kept at once (they live for
    /// `dedup.retention`); beyond it a result is refused with 429. 100 000 unless set.
    #[serde(default)]
    pub results_max: Option<u64>,
    /// Bytes of such results this caller may have kept at once; 64 MiB unless set.
    #[serde(default)]
    pub result_bytes_max: Option<u64>,
}

fn default_namespace() -> String {
    "default".into()
}

/// The API's callers: named once each, with a token that resolves, and a bounded lease.
pub(crate) fn check(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    let mut names = std::collections::HashSet::new();
    let mut tokens = std::collections::HashMap::new();
    for (i, caller) in config.api.callers.iter().enumerate() {
        let at = |field: &str| format!("api.caller[{i}].{field}");
        if caller.name.trim().is_empty() || !names.insert(caller.name.as_str()) {
            report(
                Severity::Error,
                &at("name"),
                format!(
                    "{:?}: every caller needs a name of its own (logs and metrics tell them apart)",
                    caller.name
                ),
            );
        }
        if caller.namespace.trim().is_empty() {
            report(
                Severity::Error,
                &at("namespace"),
                "is empty: leave it out for \"default\"".into(),
            );
        }
        match caller.token.resolve() {
            Err(message) => report(Severity::Error, &at("token"), message),
            // The token is who the caller is: two callers with one token cannot be told apart
            // (the first would take every request of both).
            Ok(token) => {
                if let Some(other) = tokens.insert(token, caller.name.as_str()) {
                    report(
                        Severity::Error,
                        &at("token"),
                        format!(
                            "the same token as caller {other:?}: a request could not tell which \
                             caller it is; give each caller its own token"
                        ),
                    );
                }
            }
        }
        if caller.results_max == Some(0) || caller.result_bytes_max == Some(0) {
            report(
                Severity::Error,
                &at(if caller.results_max == Some(0) {
                    "results_max"
                } else {
                    "result_bytes_max"
                }),
                "0 would refuse every result: leave it out for the default".into(),
            );
        }
    }
    if config.api.max_lease < Duration::from_secs(1)
        || config.api.max_lease > Duration::from_secs(24 * 3600)
    {
        report(
            Severity::Error,
            "api.max_lease",
            format!(
                "{}: between 1s and 24h (a lease outliving its holder blocks the key that long)",
                human(config.api.max_lease)
            ),
        );
    }
    if !(1..=1_000_000).contains(&config.api.max_waiting_sends) {
        report(
            Severity::Error,
            "api.max_waiting_sends",
            format!("{}: between 1 and 1000000", config.api.max_waiting_sends),
        );
    }
    if config.api.max_wait > Duration::from_secs(300) {
        report(
            Severity::Error,
            "api.max_wait",
            format!(
                "{}: at most 5m (a caller waiting longer holds a connection that long)",
                human(config.api.max_wait)
            ),
        );
    }
}
