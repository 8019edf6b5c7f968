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
    /// Most events of one tenant waiting in the queue; beyond it that tenant's callbacks get
    /// 503 (nothing recorded, its platform retries) while the others are admitted. No bound
    /// when absent.
    pub max_queued_per_tenant: Option<u64>,
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
            max_queued_per_tenant: None,
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
    if config.dispatcher.max_queued_per_tenant == Some(0) {
        report(
            Severity::Error,
            "dispatcher.max_queued_per_tenant",
            "a bound of 0 refuses every event; use e.g. 10000, or leave it out".into(),
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate;

    fn found(config: &Config) -> Vec<(Severity, String)> {
        validate(config)
            .into_iter()
            .filter(|p| {
                p.setting.starts_with("dispatcher.tenant") || p.setting.ends_with("per_tenant")
            })
            .map(|p| (p.severity, p.setting))
            .collect()
    }

    #[test]
    fn tenant_bounds_are_checked_on_every_store() {
        let mut config = Config::default();
        assert_eq!(found(&config), []);
        config.dispatcher.tenant_concurrency = Some(0);
        config.dispatcher.max_queued_per_tenant = Some(0);
        assert_eq!(
            found(&config),
            [
                (Severity::Error, "dispatcher.tenant_concurrency".to_owned()),
                (
                    Severity::Error,
                    "dispatcher.max_queued_per_tenant".to_owned()
                ),
            ]
        );
        config.dispatcher.tenant_concurrency = Some(config.dispatcher.concurrency as u32);
        config.dispatcher.max_queued_per_tenant = Some(10_000);
        assert_eq!(
            found(&config),
            [(
                Severity::Warning,
                "dispatcher.tenant_concurrency".to_owned()
            )]
        );
        config.dispatcher.tenant_concurrency = Some(8);
        assert_eq!(found(&config), []);
        config.store = toml::from_str::<Config>("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\ndurability = \"memory\"\n")
            .expect("redis")
            .store;
        assert_eq!(found(&config), [], "Redis counts each tenant's events too");
    }
}
