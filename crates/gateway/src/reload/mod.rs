//! Reloading the configuration file without a restart (SIGHUP, `oncegate reload`, `POST
//! /admin/reload`): its dynamic part — webhook sources and their secrets, what sends as them,
//! routes, `dispatcher.max_queued` — is validated, built beside what runs, and put in force
//! whole; on any error nothing changes and the answer, the log and
//! `oncegate_reloads_total{outcome="refused"}` say why. Listeners, the store and queued events
//! are untouched; a changed source's old secrets are still taken for `server.secret_overlap`.

pub(crate) mod build;

use std::sync::{Arc, Mutex};

use oncegate_config::{Config, Severity};
use oncegate_core::Store;
use serde::Serialize;

use crate::{Gateway, Shared, registry};

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reloaded {
    /// The webhook sources, by name.
    pub sources: Changes,
    /// The routes.
    pub routes: Changes,
    /// `dispatcher.max_queued` now.
    pub max_queued: Option<u64>,
}

/// What changed in one part of the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    /// New ones.
    pub added: Vec<String>,
    /// Ones whose settings or secrets changed (rebuilt).
    pub changed: Vec<String>,
    /// Ones the file no longer has.
    pub removed: Vec<String>,
    /// How many stayed as they were.
    pub kept: usize,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadRefused {
    /// The file could not be read or parsed.
    #[error("the configuration cannot be read: {0}")]
    Unreadable(String),
    /// The file has errors.
    #[error("the configuration has errors: {}", .0.join("; "))]
    Invalid(Vec<String>),
    /// A setting that only a restart changes differs.
    #[error("only a restart changes {}: restore them to reload, or restart", .0.join(", "))]
    Static(Vec<String>),
    /// Building what the file describes failed (a sink, a secret, a registry).
    #[error("{0}")]
    Build(String),
    /// This gateway was built in code, or started without a file to read again.
    #[error("this gateway was not started from a configuration file: there is nothing to reload")]
    NoFile,
}

/// Reads the configuration again: the file the gateway started from.
pub type Loader = Box<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// What a gateway started from a file keeps to reload it.
#[derive(Default)]
pub(crate) struct ReloadState {
    /// The configuration in force (its static part is what it started with).
    pub(crate) config: Mutex<Option<Config>>,
    /// Reads the file again.
    pub(crate) loader: Option<Loader>,
    /// One reload at a time.
    pub(crate) running: tokio::sync::Mutex<()>,
}

impl<S: Store> Gateway<S> {
    /// Reloads with what `loader` reads (the file the gateway started from): SIGHUP,
    /// `oncegate reload` and `POST /admin/reload` call it.
    pub fn reload_from(mut self, loader: Loader) -> Result<Self, crate::GatewayError> {
        self.shared_mut()?.reload.loader = Some(loader);
        Ok(self)
    }

    /// Reads the file again and puts its dynamic part in force, or changes nothing and says
    /// why.
    pub async fn reload(&self) -> Result<Reloaded, ReloadRefused> {
        reload(&self.shared).await
    }

    /// Puts `config`'s dynamic part in force, or changes nothing and says why.
    pub async fn reload_with(&self, config: &Config) -> Result<Reloaded, ReloadRefused> {
        apply(&self.shared, config).await
    }
}

/// Reads the file again and applies it.
pub(crate) async fn reload<S: Store>(shared: &Arc<Shared<S>>) -> Result<Reloaded, ReloadRefused> {
    if shared.reload.loader.is_none() {
        return Err(said(ReloadRefused::NoFile));
    }
    // A file read (and its secrets' files): off the async threads.
    let reading = shared.clone();
    let read = tokio::task::spawn_blocking(move || match &reading.reload.loader {
        Some(loader) => loader().map_err(ReloadRefused::Unreadable),
        None => Err(ReloadRefused::NoFile),
    })
    .await
    .unwrap_or_else(|_| Err(ReloadRefused::Unreadable("reading the file failed".into())));
    match read {
        Ok(config) => apply(shared, &config).await,
        Err(refused) => Err(said(refused)),
    }
}

/// Applies `config`, one reload at a time.
async fn apply<S: Store>(
    shared: &Arc<Shared<S>>,
    config: &Config,
) -> Result<Reloaded, ReloadRefused> {
    let _one = shared.reload.running.lock().await;
    let outcome = async {
        let invalid: Vec<String> = oncegate_config::validate(config)
            .into_iter()
            .chain(crate::sink::configured::left_out(config))
            .filter(|problem| problem.severity == Severity::Error)
            .map(|problem| problem.to_string())
            .collect();
        if !invalid.is_empty() {
            return Err(ReloadRefused::Invalid(invalid));
        }
        let running = lock(&shared.reload.config)
            .clone()
            .ok_or(ReloadRefused::NoFile)?;
        let statics = static_changes(&running, config);
        if !statics.is_empty() {
            return Err(ReloadRefused::Static(statics));
        }
        let dynamic = build::build(config, shared, true)
            .await
            .map_err(|error| ReloadRefused::Build(error.to_string()))?;
        #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
        let new_keepers = dynamic.new_keepers.clone();
        let reloaded = build::install(shared, dynamic);
        shared.at_risk.store(Arc::new(at_risk(config)));
        *lock(&shared.reload.config) = Some(config.clone());
        #[cfg(feature = "send")]
        crate::api::send::register(shared.api.senders.load().keys());
        crate::dispatch::routes::register(&shared.routes.load());
        #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
        crate::credentials::at_start(&new_keepers).await;
        Ok(reloaded)
    }
    .await;
    match outcome {
        Ok(reloaded) => {
            metrics::counter!("oncegate_reloads_total", "outcome" => "applied").increment(1);
            tracing::info!(sources = ?reloaded.sources, routes = ?reloaded.routes, max_queued = ?reloaded.max_queued, "configuration reloaded");
            let overlap = config.server.secret_overlap;
            if !reloaded.sources.changed.is_empty() && !overlap.is_zero() {
                // Taking the old secrets is a choice an operator must see: one rotating a leaked
                // secret reloads with server.secret_overlap = "0s".
                tracing::warn!(sources = ?reloaded.sources.changed, "callbacks signed or encrypted with these sources' old secrets are still taken for {} (server.secret_overlap); if an old secret leaked, reload again with secret_overlap = \"0s\"", humantime::format_duration(overlap));
            }
            Ok(reloaded)
        }
        Err(refused) => Err(said(refused)),
    }
}

/// What `config` can lose or expose by design, each "setting: why": the configuration checks'
/// `AtRisk` findings, the one place that knows (start and check-config say them too).
pub(crate) fn at_risk(config: &Config) -> Vec<String> {
    oncegate_config::validate(config)
        .into_iter()
        .filter(|problem| problem.severity == Severity::AtRisk)
        .map(|problem| format!("{}: {}", problem.setting, problem.message))
        .collect()
}

/// A refused reload, counted and logged: the running configuration stays.
fn said(refused: ReloadRefused) -> ReloadRefused {
    metrics::counter!("oncegate_reloads_total", "outcome" => "refused").increment(1);
    tracing::error!("reload refused, the running configuration stays: {refused}");
    refused
}

/// The settings only a restart changes that differ between `running` and `new`: every section
/// but the webhook sources, the routes, `dispatcher.max_queued` and `server.secret_overlap`; a
/// long-connection source (its connections are held from start) by name.
pub(crate) fn static_changes(running: &Config, new: &Config) -> Vec<String> {
    let mut changes = Vec::new();
    let mut differ = |name: &str, same: bool| {
        if !same {
            changes.push(name.to_owned());
        }
    };
    differ("[store]", running.store == new.store);
    differ("[dedup]", running.dedup == new.dedup);
    differ("[lease]", running.lease == new.lease);
    differ("[replay]", running.replay == new.replay);
    // How long a changed source's old secrets are still taken is the reload's own choice (an
    // operator rotating a leaked secret sets it to 0s in the same reload).
    let server = |config: &Config| oncegate_config::ServerConfig {
        secret_overlap: std::time::Duration::ZERO,
        ..config.server.clone()
    };
    differ("[server]", server(running) == server(new));
    let dispatcher = |config: &Config| oncegate_config::DispatcherConfig {
        max_queued: None,
        ..config.dispatcher.clone()
    };
    differ("[dispatcher]", dispatcher(running) == dispatcher(new));
    differ("[api]", running.api == new.api);
    differ("[log]", running.log == new.log);
    differ("[telemetry]", running.telemetry == new.telemetry);
    let long = |config: &Config| -> Vec<oncegate_config::SourceConfig> {
        config
            .sources
            .iter()
            .filter(|source| registry::is_long_connection(source))
            .cloned()
            .collect()
    };
    let (before, after) = (long(running), long(new));
    let mut names: Vec<&str> = before
        .iter()
        .chain(&after)
        .map(|source| source.name.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let of = |list: &[oncegate_config::SourceConfig]| {
            list.iter().find(|source| source.name == name).cloned()
        };
        differ(
            &format!("source {name:?} (a long connection)"),
            of(&before) == of(&after),
        );
    }
    changes
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
