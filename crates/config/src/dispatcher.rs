//! `[dispatcher]`: how admitted events are handed to routes.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checks::{Severity, human};
use crate::duration;
use crate::*;

/// `[dispatcher]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatcherConfig {
    /// Handlers running at once, over all partitions.
    pub concurrency: usize,
    /// Handlers one tenant (a platform's app and tenant: a Feishu `tenant_key`, a WeCom corp's
    /// agent) may have at once; no cap when absent. Free handlers go to the least busy tenant
    /// first whatever this says; a cap also keeps handlers free for the others' next events.
    pub tenant_concurrency: Option<u32>,
    /// Attempts before an event goes to the dead letters.
    pub max_attempts: u32,
    /// The first retry's delay; it doubles per attempt, with jitter.
    #[serde(with = "duration")]
    pub backoff_base: Duration,
    /// The longest retry delay.
    #[serde(with = "duration")]
    pub backoff_max: Duration,
    /// On shutdown, how long running handlers may finish before their leases are released.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Most events waiting in the queue; beyond it ingress answers 503 and records nothing
    /// (the platform retries). No bound when absent.
    pub max_queued: Option<u64>,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            concurrency: 256,
            tenant_concurrency: None,
            max_attempts: 8,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(10),
            max_queued: None,
        }
    }
}

/// `[dispatcher]`.
pub(crate) fn check(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    if config.dispatcher.concurrency == 0 {
        report(
            Severity::Error,
            "dispatcher.concurrency",
            "zero handlers can run nothing; use e.g. 64".into(),
        );
    }
    match config.dispatcher.tenant_concurrency {
        Some(0) => report(
            Severity::Error,
            "dispatcher.tenant_concurrency",
            "zero handlers per tenant can run nothing; use e.g. a quarter of dispatcher.concurrency, or leave it out".into(),
        ),
        Some(cap) if cap as usize >= config.dispatcher.concurrency => report(
            Severity::Warning,
            "dispatcher.tenant_concurrency",
            format!(
                "{cap} is not below dispatcher.concurrency ({}): it caps nothing; lower it or leave it out",
                config.dispatcher.concurrency
            ),
        ),
        _ => {}
    }
    if config.dispatcher.max_attempts == 0 {
        report(
            Severity::Error,
            "dispatcher.max_attempts",
            "must be at least 1".into(),
        );
    }
    if config.dispatcher.backoff_base > config.dispatcher.backoff_max {
        report(
            Severity::Error,
            "dispatcher.backoff_base",
            format!(
                "{} is longer than dispatcher.backoff_max ({})",
                human(config.dispatcher.backoff_base),
                human(config.dispatcher.backoff_max)
            ),
        );
    }
}
