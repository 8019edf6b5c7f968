//! `[[route]]`: where events go, by event type.

use std::path::PathBuf;
use std::time::Duration;

use oncegate_core::redact::url as redact_url;
use serde::{Deserialize, Serialize};

use crate::checks::{Severity, plain_http_off_host, scheme_of};
use crate::duration;
use crate::*;

/// Where a route's events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// POST to `url`, signed the Standard Webhooks way.
    Http,
    /// JSON lines on standard output.
    Stdout,
    /// JSON lines appended to `path`.
    File,
    /// Produced to `topic` on `brokers`, keyed by the event's chat (a build with the `kafka`
    /// feature).
    Kafka,
}

/// Which of a route's events go before the rest of their tenant's backlog (never before an
/// earlier event of their own chat): what a person waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Messages addressed to the bot: a group message that @-mentions it, a direct message
    /// (Feishu `p2p`; a WeCom app's, a WeChat account's or an AI bot's messages, which are
    /// only ever sent to it — an AI bot gets a group message only when @-mentioned).
    #[default]
    Mentions,
    /// Every event of the route.
    All,
    /// None: the route's events go in their tenant's turn, oldest first.
    None,
}

impl Priority {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `[[route]]`: events whose type matches go to one sink.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Event types: exact (`im.message.receive_v1`), a prefix (`im.message.*`) or `*`.
    pub events: Vec<String>,
    /// The sink.
    pub sink: SinkKind,
    /// The HTTP sink's URL.
    pub url: Option<String>,
    /// The HTTP sink's Standard Webhooks secret (`whsec_` + base64).
    pub secret: Option<Secret>,
    /// Secrets being rotated out: every delivery is signed with each of them too (one `v1`
    /// signature per secret in `webhook-signature`), so that a receiver still checking an old
    /// secret verifies while it moves to the new one. Remove them once it has.
    #[serde(default)]
    pub previous_secrets: Vec<Secret>,
    /// An Ed25519 key (`whsk_` + base64) that signs every delivery too, as a `v1a` signature:
    /// receivers verify with its public key (`whpk_…`, shown by `GET /admin/routes`) and, unlike
    /// with a shared secret, cannot sign themselves.
    pub signing_key: Option<Secret>,
    /// The file sink's path.
    pub path: Option<PathBuf>,
    /// The HTTP sink's timeout per attempt.
    #[serde(with = "duration", default = "default_sink_timeout")]
    pub timeout: Duration,
    /// Drop an event older than one already applied for its chat.
    #[serde(default)]
    pub watermark: bool,
    /// The HTTP sink's answer is the platform's passive reply (WeCom, WeChat): matching events
    /// are handled as they arrive, within the platform's deadline, instead of queued.
    #[serde(default)]
    pub reply: bool,
    /// The wait after each failed attempt (`"standard-webhooks"` or a list like
    /// `["5s", "5m", "30m"]`); the dispatcher's doubling backoff and `max_attempts` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_schedule: Option<RetrySchedule>,
    /// The longest an event that keeps failing may hold its chat's later events back (from
    /// its first attempt). Past it the event is set aside in the dead letters, with the reason,
    /// and the chat's later events go on; events without a chat retry their whole schedule.
    /// No bound when absent: order first.
    #[serde(
        default,
        with = "crate::duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub hold_chat: Option<Duration>,
    /// Which of its events go before the rest of their tenant's backlog: `"mentions"` (the
    /// default: messages addressed to the bot), `"all"` or `"none"`.
    #[serde(default, skip_serializing_if = "Priority::is_default")]
    pub priority: Priority,
    /// The tenants whose events it takes (a Feishu `tenant_key`, a WeCom corp id), matched
    /// exactly; every tenant's when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    /// The agents whose events it takes (a WeCom app's AgentID), matched exactly; every
    /// agent's when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    /// The Kafka sink's brokers, comma-separated (`host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brokers: Option<String>,
    /// The Kafka sink's topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The Kafka sink's client settings (librdkafka's names: `security.protocol`,
    /// `sasl.username`, `sasl.password` …), each a value or a secret's source.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kafka: std::collections::BTreeMap<String, Secret>,
}

/// The URL without credentials, the secret hidden.
impl std::fmt::Debug for RouteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteConfig")
            .field("events", &self.events)
            .field("sink", &self.sink)
            .field("url", &self.url.as_deref().map(redact_url))
            .field("secret", &self.secret)
            .field("previous_secrets", &self.previous_secrets)
            .field("signing_key", &self.signing_key)
            .field("path", &self.path)
            .field("timeout", &self.timeout)
            .field("watermark", &self.watermark)
            .field("reply", &self.reply)
            .field("retry_schedule", &self.retry_schedule)
            .field("hold_chat", &self.hold_chat)
            .field("priority", &self.priority)
            .field("tenants", &self.tenants)
            .field("agents", &self.agents)
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("kafka", &self.kafka)
            .finish()
    }
}

fn default_sink_timeout() -> Duration {
    Duration::from_secs(10)
}

impl RouteConfig {
    /// The route with every secret resolved now ([`Secret::resolved`]): what a reload
    /// compares, so that a secret rotated in its file is a change too.
    pub fn resolved(&self) -> Result<RouteConfig, String> {
        let mut route = self.clone();
        let resolve = |setting: &str, secret: &mut Secret| {
            *secret = secret
                .resolved()
                .map_err(|message| format!("route {:?} {setting}: {message}", self.events))?;
            Ok::<_, String>(())
        };
        if let Some(secret) = &mut route.secret {
            resolve("secret", secret)?;
        }
        if let Some(key) = &mut route.signing_key {
            resolve("signing_key", key)?;
        }
        for secret in &mut route.previous_secrets {
            resolve("previous_secrets", secret)?;
        }
        for (name, secret) in &mut route.kafka {
            resolve(name, secret)?;
        }
        Ok(route)
    }

    /// Whether `event_type` is one of this route's.
    pub fn matches(&self, event_type: &str) -> bool {
        event_type_matches(&self.events, event_type)
    }
}

/// The placeholders a route's URL may hold in its path or query, replaced in each delivery by
/// the event's owner (percent-encoded; `_` when it has none).
pub const URL_PLACEHOLDERS: [&str; 2] = ["{tenant}", "{agent}"];

/// Whether `owner` (an event's tenant or agent) is one of `allowed` (every one when empty).
pub fn owner_matches(allowed: &[String], owner: Option<&str>) -> bool {
    allowed.is_empty() || owner.is_some_and(|owner| allowed.iter().any(|a| a == owner))
}

/// Whether `event_type` matches one of `patterns`: exact, `prefix*`, or `*`.
pub fn event_type_matches(patterns: &[String], event_type: &str) -> bool {
    patterns
        .iter()
        .any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => event_type.starts_with(prefix),
            None => pattern == event_type,
        })
}

/// Whether every event type `later` matches, `earlier` matches too (`*`, a prefix, exact).
fn pattern_covers(earlier: &str, later: &str) -> bool {
    match earlier.strip_suffix('*') {
        Some(prefix) => later.starts_with(prefix),
        None => earlier == later,
    }
}

/// Whether every event `later` could take, `earlier` (listed before it) takes first: each of
/// its patterns covered, and its owners within the earlier one's.
fn shadows(earlier: &RouteConfig, later: &RouteConfig) -> bool {
    let within = |earlier: &[String], later: &[String]| {
        earlier.is_empty() || (!later.is_empty() && later.iter().all(|id| earlier.contains(id)))
    };
    !later.events.is_empty()
        && later
            .events
            .iter()
            .all(|pattern| earlier.events.iter().any(|e| pattern_covers(e, pattern)))
        && within(&earlier.tenants, &later.tenants)
        && within(&earlier.agents, &later.agents)
}

/// A route after one that takes every event it could match never gets an event: the first
/// route that matches takes it.
fn check_shadowed(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    for (i, later) in config.routes.iter().enumerate() {
        if let Some(j) = config.routes[..i].iter().position(|e| shadows(e, later)) {
            report(
                Severity::Warning,
                &format!("route[{i}].events"),
                format!(
                    "never matches: route[{j}] (events {:?}) comes first and takes every event \
                     this one could, and an event goes to the first route that matches; move \
                     this route above it",
                    config.routes[j].events
                ),
            );
        }
    }
}

/// Tenants and agents are ids, not blanks; a URL names them in its path or query only — in
/// its host they would choose the server the events go to.
fn check_owners(
    route: &RouteConfig,
    at: &impl Fn(&str) -> String,
    report: &mut impl FnMut(Severity, &str, String),
) {
    for (field, ids) in [("tenants", &route.tenants), ("agents", &route.agents)] {
        if ids.iter().any(|id| id.trim().is_empty() || id.trim() != id) {
            report(
                Severity::Error,
                &at(field),
                format!("{field} are ids matched exactly: no empty ones, no spaces around them"),
            );
        }
    }
    let Some(url) = &route.url else {
        return;
    };
    let authority_end = url
        .find("://")
        .map(|scheme| scheme + 3)
        .and_then(|start| url[start..].find(['/', '?']).map(|end| start + end))
        .unwrap_or(url.len());
    if URL_PLACEHOLDERS
        .iter()
        .any(|placeholder| url[..authority_end].contains(placeholder))
    {
        report(
            Severity::Error,
            &at("url"),
            "{tenant} and {agent} may stand in the URL's path or query, not its host: an \
             event's owner must not choose the server its events go to"
                .into(),
        );
    }
}

/// Every `[[route]]`: its events, sink, secrets and keys.
pub(crate) fn check(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    check_shadowed(config, report);
    for (i, route) in config.routes.iter().enumerate() {
        let at = |field: &str| format!("route[{i}].{field}");
        if route.events.is_empty() || route.events.iter().any(|e| e.trim().is_empty()) {
            report(
                Severity::Error,
                &at("events"),
                "name at least one event type (exact, a prefix ending in *, or *)".into(),
            );
        }
        match route.sink {
            crate::SinkKind::Http => match &route.url {
                Some(url) if plain_http_off_host(url) => report(
                    Severity::AtRisk,
                    &at("url"),
                    "events (decrypted messages) travel to another host unencrypted: use \
                     https:// (http:// is meant for a receiver on this machine)"
                        .into(),
                ),
                Some(url) if url.starts_with("http://") || url.starts_with("https://") => {}
                Some(url) => report(
                    Severity::Error,
                    &at("url"),
                    format!("{} is not an http:// or https:// URL", scheme_of(url)),
                ),
                None => report(
                    Severity::Error,
                    &at("url"),
                    "sink = \"http\" needs a url".into(),
                ),
            },
            crate::SinkKind::File => {
                if route.path.is_none() {
                    report(
                        Severity::Error,
                        &at("path"),
                        "sink = \"file\" needs a path".into(),
                    );
                }
            }
            crate::SinkKind::Stdout | crate::SinkKind::Kafka => {}
        }
        crate::kafka::check(route, &at, report);
        check_owners(route, &at, report);
        if route.sink != crate::SinkKind::Http && (route.url.is_some() || route.secret.is_some()) {
            report(
                Severity::Error,
                &at("url"),
                "url and secret belong to sink = \"http\"".into(),
            );
        }
        let named = route
            .secret
            .iter()
            .map(|secret| ("secret".to_owned(), secret));
        let previous = route
            .previous_secrets
            .iter()
            .enumerate()
            .map(|(i, secret)| (format!("previous_secrets[{i}]"), secret));
        for (field, secret) in named.chain(previous) {
            match secret.resolve() {
                Err(message) => report(Severity::Error, &at(&field), message),
                Ok(value) if !value.starts_with("whsec_") => report(
                    Severity::Error,
                    &at(&field),
                    "a Standard Webhooks secret is \"whsec_\" followed by base64".into(),
                ),
                Ok(_) => {}
            }
        }
        if let Some(key) = &route.signing_key {
            match key.resolve() {
                Err(message) => report(Severity::Error, &at("signing_key"), message),
                Ok(value) if !value.starts_with("whsk_") => report(
                    Severity::Error,
                    &at("signing_key"),
                    "an asymmetric signing key is \"whsk_\" followed by the base64 of an \
                     Ed25519 key"
                        .into(),
                ),
                Ok(_) => {}
            }
            if route.sink != crate::SinkKind::Http {
                report(
                    Severity::Error,
                    &at("signing_key"),
                    "signing_key belongs to sink = \"http\"".into(),
                );
            }
        }
        if !route.previous_secrets.is_empty() && route.secret.is_none() {
            report(
                Severity::Error,
                &at("previous_secrets"),
                "secrets being rotated out need the new one: set secret".into(),
            );
        }
        if route.sink == crate::SinkKind::Http
            && route.secret.is_none()
            && route.signing_key.is_none()
        {
            report(
                Severity::AtRisk,
                &at("secret"),
                "an http route without a secret sends unsigned requests: the receiver cannot \
                 tell them from forgeries. Set secret = \"whsec_...\""
                    .into(),
            );
        }
        if route.timeout.is_zero() {
            report(
                Severity::Error,
                &at("timeout"),
                "a zero timeout fails every delivery".into(),
            );
        }
        let cards = route
            .events
            .iter()
            .any(|e| e == "card.action.trigger" || e == "url.preview.get");
        if cards && route.sink != crate::SinkKind::Http {
            report(
                Severity::Error,
                &at("sink"),
                "card callbacks are answered with the sink's reply, so they need sink = \"http\""
                    .into(),
            );
        }
        if route.reply && route.sink != crate::SinkKind::Http {
            report(
                Severity::Error,
                &at("reply"),
                "a passive reply is the sink's answer, so reply = true needs sink = \"http\""
                    .into(),
            );
        }
        crate::retries::check(route, config.dedup.retention, &at, report);
        if route.reply && route.watermark {
            report(
                Severity::Error,
                &at("watermark"),
                "a replying route handles events as they arrive, not in chat order: \
                 a watermark cannot apply; use a queued route for these events"
                    .into(),
            );
        }
    }
}
