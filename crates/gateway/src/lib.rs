//! The gateway: HTTP ingress for platform callbacks, the dispatcher that hands admitted events
//! to sinks once and in per-chat order, and the admin API.
//!
//! Build one with [`Gateway::from_config`] (or [`Gateway::new`] and [`Gateway::route`] for
//! library use), then run [`Gateway::serve`] and [`Gateway::dispatch`] until shutdown.

mod admin;
mod dispatch;
mod ingress;
pub mod sink;
mod spooling;
pub mod stats;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncegate_config::{Config, DispatcherConfig, Platform, SinkKind};
use oncegate_core::replay::ReplayGuard;
use oncegate_core::{Clock, Store, SystemClock};
use oncegate_feishu::FeishuApp;
pub use oncegate_spool::Spool;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use sink::{Handler, HandlerSink, HttpSink, LinesSink, Outgoing, SharedSink, Sink, SinkError};
pub use stats::{Stats, StatsSnapshot};

/// Why a gateway could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A setting cannot be used.
    #[error("{0}")]
    Config(String),
    /// A sink could not be set up.
    #[error(transparent)]
    Sink(#[from] sink::SinkSetupError),
    /// A listener failed.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// One configured source with its replay guard.
pub(crate) struct Source {
    pub(crate) app: FeishuApp,
    pub(crate) replay: Option<Mutex<ReplayGuard>>,
    /// How long a nonce must be remembered: twice the allowed skew.
    pub(crate) nonce_window: Duration,
}

/// One route: which event types, which sink, and whether stale events are dropped.
pub(crate) struct Route {
    pub(crate) patterns: Vec<String>,
    pub(crate) sink: SharedSink,
    pub(crate) watermark: bool,
}

impl Route {
    fn matches(&self, event_type: &str) -> bool {
        oncegate_config::event_type_matches(&self.patterns, event_type)
    }
}

/// Timing of claims and retries.
#[derive(Debug, Clone)]
pub struct Timing {
    /// Seen-mark and completion retention.
    pub retention: Duration,
    /// Lease length.
    pub lease: Duration,
    /// Lease renewal period.
    pub renew_every: Duration,
    /// Dispatcher settings.
    pub dispatcher: DispatcherConfig,
}

impl Default for Timing {
    fn default() -> Self {
        let config = Config::default();
        Self {
            retention: config.dedup.retention,
            lease: config.lease.duration,
            renew_every: config.lease.renew_every,
            dispatcher: config.dispatcher,
        }
    }
}

/// The shared state of a running gateway.
pub(crate) struct Shared<S> {
    pub(crate) store: S,
    pub(crate) sources: HashMap<String, Source>,
    pub(crate) routes: Vec<Route>,
    pub(crate) timing: Timing,
    pub(crate) body_limit: usize,
    pub(crate) admin_token: Option<String>,
    pub(crate) stats: Stats,
    /// Woken when a partition may have work: an admit, an ack that frees a chat.
    pub(crate) wake: Vec<Notify>,
    pub(crate) clock: SystemClock,
    pub(crate) metrics_render: Option<Box<dyn Fn() -> String + Send + Sync>>,
    /// Where accepted admissions wait while the store is down, if configured.
    pub(crate) spool: Option<Arc<Spool>>,
    /// Woken when the spool gets an admission.
    pub(crate) spooled: Notify,
}

impl<S: Store> Shared<S> {
    pub(crate) fn route_for(&self, event_type: &str) -> Option<&Route> {
        self.routes.iter().find(|route| route.matches(event_type))
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn wake(&self, partition: u16) {
        if let Some(notify) = self.wake.get(usize::from(partition)) {
            notify.notify_one();
        }
    }
}

/// A gateway over the store `S`.
pub struct Gateway<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for Gateway<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

/// What `Gateway::new` needs besides the store.
pub struct GatewayParts {
    /// Named sources: `/webhook/<name>`.
    pub sources: Vec<(String, FeishuApp)>,
    /// Replay guard: allowed skew and nonces per generation; `None` turns it off.
    pub replay: Option<(Duration, usize)>,
    /// Timing.
    pub timing: Timing,
    /// Largest body.
    pub body_limit: usize,
    /// Admin bearer token.
    pub admin_token: Option<String>,
}

impl<S: Store> Gateway<S> {
    /// A gateway with no routes yet.
    pub fn new(store: S, parts: GatewayParts) -> Self {
        let partitions = store.partitions();
        let sources = parts
            .sources
            .into_iter()
            .map(|(name, app)| {
                let replay = parts
                    .replay
                    .map(|(skew, nonces)| Mutex::new(ReplayGuard::new(skew.as_secs(), nonces)));
                let nonce_window = parts.replay.map_or(Duration::ZERO, |(skew, _)| skew * 2);
                (
                    name,
                    Source {
                        app,
                        replay,
                        nonce_window,
                    },
                )
            })
            .collect();
        Self {
            shared: Arc::new(Shared {
                store,
                sources,
                routes: Vec::new(),
                timing: parts.timing,
                body_limit: parts.body_limit,
                admin_token: parts.admin_token,
                stats: Stats::default(),
                wake: (0..partitions).map(|_| Notify::new()).collect(),
                clock: SystemClock,
                metrics_render: None,
                spool: None,
                spooled: Notify::new(),
            }),
        }
    }

    fn shared_mut(&mut self) -> Result<&mut Shared<S>, GatewayError> {
        Arc::get_mut(&mut self.shared)
            .ok_or_else(|| GatewayError::Config("configure the gateway before running it".into()))
    }

    /// Adds a route: events whose type matches one of `patterns` (exact, `prefix*` or `*`) go
    /// to `sink`; with `watermark`, an event older than one already applied for its chat is
    /// dropped.
    pub fn route(
        mut self,
        patterns: &[&str],
        sink: SharedSink,
        watermark: bool,
    ) -> Result<Self, GatewayError> {
        self.shared_mut()?.routes.push(Route {
            patterns: patterns.iter().map(|p| (*p).to_owned()).collect(),
            sink,
            watermark,
        });
        Ok(self)
    }

    /// Spools accepted admissions to `spool` while the store cannot be reached (answering 200
    /// instead of 503) and hands them to the store, in order, when it answers again.
    pub fn spool(mut self, spool: Spool) -> Result<Self, GatewayError> {
        self.shared_mut()?.spool = Some(Arc::new(spool));
        Ok(self)
    }

    /// Serves Prometheus metrics from `render` at the admin listener's `/metrics`.
    pub fn metrics(
        mut self,
        render: impl Fn() -> String + Send + Sync + 'static,
    ) -> Result<Self, GatewayError> {
        self.shared_mut()?.metrics_render = Some(Box::new(render));
        Ok(self)
    }

    /// Builds the gateway a configuration describes, on `store`.
    pub async fn from_config(config: &Config, store: S) -> Result<Self, GatewayError> {
        let resolve =
            |secret: &Option<oncegate_config::Secret>| -> Result<Option<String>, GatewayError> {
                secret
                    .as_ref()
                    .map(|s| s.resolve().map_err(GatewayError::Config))
                    .transpose()
            };
        let mut sources = Vec::new();
        for source in &config.sources {
            let lark = match source.platform {
                Platform::Feishu => false,
                Platform::Lark => true,
                other => {
                    return Err(GatewayError::Config(format!(
                        "source {:?}: platform {other:?} is not supported by this version yet",
                        source.name
                    )));
                }
            };
            sources.push((
                source.name.clone(),
                FeishuApp::new(
                    lark,
                    &source.app_id,
                    resolve(&source.encrypt_key)?,
                    resolve(&source.verification_token)?,
                ),
            ));
        }
        let parts = GatewayParts {
            sources,
            replay: config
                .replay
                .enabled
                .then_some((config.replay.max_skew, config.replay.max_nonces)),
            timing: Timing {
                retention: config.dedup.retention,
                lease: config.lease.duration,
                renew_every: config.lease.renew_every,
                dispatcher: config.dispatcher.clone(),
            },
            body_limit: config.server.body_limit,
            admin_token: resolve(&config.server.admin_token)?,
        };
        let mut gateway = Self::new(store, parts);
        for route in &config.routes {
            let sink: SharedSink =
                match route.sink {
                    SinkKind::Http => {
                        let url = route.url.as_deref().ok_or_else(|| {
                            GatewayError::Config("an http route needs a url".into())
                        })?;
                        Arc::new(HttpSink::new(
                            url,
                            resolve(&route.secret)?.as_deref(),
                            route.timeout,
                        )?)
                    }
                    SinkKind::Stdout => Arc::new(LinesSink::stdout()),
                    SinkKind::File => {
                        let path = route.path.as_deref().ok_or_else(|| {
                            GatewayError::Config("a file route needs a path".into())
                        })?;
                        Arc::new(LinesSink::file(path).await?)
                    }
                };
            let patterns: Vec<&str> = route.events.iter().map(String::as_str).collect();
            gateway = gateway.route(&patterns, sink, route.watermark)?;
        }
        Ok(gateway)
    }

    /// The counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// Serves callbacks on `listener` and the admin API on `admin` until `shutdown` is
    /// cancelled; requests in progress finish first.
    pub async fn serve(
        &self,
        listener: TcpListener,
        admin: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        let webhooks = axum::serve(listener, ingress::router(self.shared.clone()))
            .with_graceful_shutdown(shutdown.clone().cancelled_owned());
        let admin = axum::serve(admin, admin::router(self.shared.clone()))
            .with_graceful_shutdown(shutdown.cancelled_owned());
        let (a, b) = tokio::join!(webhooks.into_future(), admin.into_future());
        a?;
        b?;
        Ok(())
    }

    /// Runs the dispatcher until `shutdown` is cancelled, then lets running handlers finish
    /// within the shutdown grace and releases what is left.
    pub async fn dispatch(&self, shutdown: CancellationToken) {
        tokio::join!(
            dispatch::run(self.shared.clone(), shutdown.clone()),
            spooling::drain(self.shared.clone(), shutdown),
        );
    }
}
