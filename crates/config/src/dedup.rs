//! `[dedup]`, `[lease]` and `[replay]`: what makes an event count once.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checks::{Severity, human};
use crate::duration;
use crate::*;

/// `[dedup]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DedupConfig {
    /// How long a seen event id is remembered.
    #[serde(with = "duration")]
    pub retention: Duration,
    /// Event-id dedup is always on; `false` is refused. Kept so that files that say `true`
    /// still load.
    pub event_id: bool,
    /// Also dedup on an event's secondary keys (Feishu's `message_id`: it can resend a message
    /// under a new event id).
    pub message_id: bool,
    /// Read by nothing: there is no business-key API yet. Accepted with a warning so that
    /// older files still load.
    pub business_keys: Option<bool>,
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(24 * 3600),
            event_id: true,
            message_id: true,
            business_keys: None,
        }
    }
}

/// `[lease]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// How long a claim holds without renewal.
    #[serde(with = "duration")]
    pub duration: Duration,
    /// How often a running handler's lease is renewed.
    #[serde(with = "duration")]
    pub renew_every: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(300),
            renew_every: Duration::from_secs(60),
        }
    }
}

/// `[replay]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplayConfig {
    /// Check request timestamps and nonces.
    pub enabled: bool,
    /// The largest accepted distance between a request's timestamp and now.
    #[serde(with = "duration")]
    pub max_skew: Duration,
    /// Nonces remembered at most, per half of the window.
    pub max_nonces: usize,
    /// Whether each admission also writes its request's nonce to the store, so that a replay
    /// reaching another gateway of the same store is refused (409) as a replay. Off, each
    /// gateway remembers only its own requests' nonces, and a replay sent to another gateway is
    /// answered as the duplicate it is (200): its event keys come from the signed request and
    /// are remembered for `dedup.retention`, far longer than a nonce's window, so it is not
    /// applied again. What it saves: on Redis a `SADD` and a `PEXPIRE` per admission.
    pub shared_nonces: bool,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_skew: Duration::from_secs(300),
            max_nonces: 1_000_000,
            shared_nonces: true,
        }
    }
}

/// `[dedup]`, `[lease]` and `[replay]`, each on its own and against the others.
pub(crate) fn check(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    if config.dedup.retention < PLATFORM_RETRY_SPAN {
        report(
            Severity::Error,
            "dedup.retention",
            format!(
                "{} is shorter than the platform's retry span (Feishu re-delivers for about {}: \
                 after 15 s, 5 min, 1 h and 6 h); a late retry would be taken for a new event. \
                 Use at least {}; 24h is the default",
                human(config.dedup.retention),
                human(PLATFORM_RETRY_SPAN),
                human(PLATFORM_RETRY_SPAN)
            ),
        );
    }
    if config.dedup.business_keys.is_some() {
        report(
            Severity::Warning,
            "dedup.business_keys",
            "has no effect: business keys are claimed through the API ([api], /keys); remove \
             the line"
                .into(),
        );
    }
    if !config.dedup.event_id && !config.replay.enabled {
        report(
            Severity::Error,
            "dedup",
            "every dedup layer is switched off (dedup.event_id and replay.enabled are both \
             false): every platform retry would run again. Remove dedup.event_id (it is always \
             on)"
            .into(),
        );
    } else if !config.dedup.event_id {
        report(
            Severity::Error,
            "dedup.event_id",
            "event-id dedup cannot be switched off: platform retries and resent frames would \
             run again. It is the layer everything else relies on; remove the line"
                .into(),
        );
    }
    if config.dedup.message_id && !config.dedup.event_id {
        report(
            Severity::Error,
            "dedup.message_id",
            "message-id dedup is an addition to event-id dedup, which is off".into(),
        );
    }
    if config.lease.duration.is_zero() {
        report(
            Severity::Error,
            "lease.duration",
            "a zero lease lets every worker claim every event at once; use e.g. \"5m\"".into(),
        );
    }
    if config.lease.renew_every.is_zero() {
        report(
            Severity::Error,
            "lease.renew_every",
            "must be more than zero; use about a fifth of lease.duration".into(),
        );
    } else if config.lease.renew_every >= config.lease.duration {
        report(
            Severity::Error,
            "lease.renew_every",
            format!(
                "{} is not shorter than lease.duration ({}): a lease would run out before its \
                 renewal and a second worker could take a running event. Use about a fifth of \
                 the lease",
                human(config.lease.renew_every),
                human(config.lease.duration)
            ),
        );
    }
    if config.lease.duration > config.dedup.retention {
        report(
            Severity::Error,
            "lease.duration",
            format!(
                "{} is longer than dedup.retention ({}); a record must outlive its lease",
                human(config.lease.duration),
                human(config.dedup.retention)
            ),
        );
    }
    if config.replay.enabled {
        if config.replay.max_skew.is_zero() {
            report(
                Severity::Error,
                "replay.max_skew",
                "a zero skew refuses every request; use e.g. \"5m\"".into(),
            );
        } else if config.replay.max_skew > Duration::from_secs(3600) {
            report(
                Severity::Error,
                "replay.max_skew",
                format!(
                    "{} lets a captured request be replayed for that long; use at most 1h \
                     (5m is usual)",
                    human(config.replay.max_skew)
                ),
            );
        }
        if config.replay.max_nonces == 0 {
            report(
                Severity::Error,
                "replay.max_nonces",
                "zero nonces refuses every request; use e.g. 100000".into(),
            );
        }
    }
}
