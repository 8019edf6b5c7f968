//! The gateway: HTTP ingress for platform callbacks, the dispatcher that hands admitted events
//! to handlers once and in per-chat order, the API, and the admin listener.
//!
//! # A guide for Rust users
//!
//! - **A bot in process**: [`bot::Bot`] takes a store, sources and handlers per event type;
//!   each handler runs once per event (several on one type too), a business key
//!   ([`bot::Ctx::once`]) makes a side effect happen once whichever event asks, and
//!   [`bot::Bot::send`] / [`bot::Ctx::send`] send once. Examples, each run by the tests:
//!   `examples/readme.rs` (the README's), `examples/feishu_bot.rs` (two handlers and a
//!   business key, on memory and on Redis), `examples/send_once.rs`.
//! - **Any side effect**: `oncegate_once::Once`, the claim protocol itself, over any store.
//! - **The gateway as the binary runs it**: [`Gateway::from_config`], then [`Gateway::serve`]
//!   and [`Gateway::dispatch`] until shutdown; a bot is the same gateway with handlers as its
//!   routes.
//! - **Features**: `feishu`, `wecom`, `long-connection`, `send`, `http-sink`, all on by
//!   default; a Feishu webhook bot needs only `feishu`.
//!
//! A message handled once, a platform retry of it caught — in process, on the memory store:
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use oncegate_feishu::{Cloud, FeishuApp, events::MessageReceived};
//! use oncegate_gateway::bot::{Bot, Ctx};
//! use tower::ServiceExt;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let app = FeishuApp::new(Cloud::Feishu, "cli_doc", None, Some("token".into())).unwrap();
//! let handled = Arc::new(AtomicU32::new(0));
//! let count = handled.clone();
//! let bot = Bot::builder(oncegate_memory::MemoryStore::new())
//!     .source("bot", app)
//!     .on_typed(move |message: MessageReceived, _: Ctx| {
//!         let count = count.clone();
//!         async move {
//!             assert_eq!(message.message.text().as_deref(), Some("hi"));
//!             count.fetch_add(1, Ordering::SeqCst);
//!             Ok(())
//!         }
//!     })
//!     .build()
//!     .unwrap();
//! let message = r#"{"schema":"2.0","header":{"event_id":"e1","token":"token","event_type":"im.message.receive_v1","create_time":"1700000000000","app_id":"cli_doc"},"event":{"sender":{"sender_id":{"open_id":"ou_1"}},"message":{"message_id":"om_1","chat_id":"oc_1","chat_type":"p2p","message_type":"text","content":"{\"text\":\"hi\"}"}}}"#;
//! for _ in 0..2 {
//!     // Feishu's first delivery, then its retry.
//!     let request = axum::http::Request::post("/webhook/bot").body(axum::body::Body::from(message)).unwrap();
//!     assert!(bot.router().oneshot(request).await.unwrap().status().is_success());
//! }
//! let stop = tokio_util::sync::CancellationToken::new();
//! let running = tokio::spawn({
//!     let (bot, stop) = (Arc::new(bot), stop.clone());
//!     async move { bot.run(stop).await }
//! });
//! for _ in 0..500 {
//!     if handled.load(Ordering::SeqCst) > 0 { break }
//!     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
//! }
//! stop.cancel();
//! running.await.unwrap().unwrap();
//! assert_eq!(handled.load(Ordering::SeqCst), 1);
//! # });
//! ```

mod admin;
pub mod api;
mod assemble;
mod base;
pub mod bot;
#[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
mod credentials;
mod dispatch;
mod gate;
mod ingress;
mod refusal;
pub mod registry;
pub mod reload;
mod route;
mod run;
mod server;
pub mod sink;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use oncegate_config::{Config, DispatcherConfig};
use oncegate_core::{Clock, Store, SystemClock, WebhookSource};
use oncegate_once::Once;
pub use oncegate_spool::Spool;
use tokio::sync::Notify;

pub use base::recorder::SECONDS_BUCKETS;
pub use base::recorder::{MetricsRecorder, MetricsRender};
pub use base::stats::{self, Stats, StatsSnapshot};
pub use base::summary::Summaries;
pub use base::traces::{EventTrace, Traces, parse_traceparent};
pub use dispatch::retries::Retries;
pub use ingress::sources::ReplayLimits;
pub(crate) use ingress::sources::Source;
pub(crate) use route::Route;
pub use server::ServerLimits;
#[cfg(feature = "http-sink")]
pub use sink::HttpSink;
#[cfg(feature = "kafka")]
pub use sink::KafkaSink;
pub use sink::configured::left_out;
pub use sink::{Handler, HandlerSink, LinesSink, Outgoing, SharedSink, Sink, SinkError};

/// Why a gateway could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A setting cannot be used.
    #[error("{0}")]
    Config(String),
    /// A sink could not be set up.
    #[error(transparent)]
    Sink(#[from] sink::SinkSetupError),
    /// A listener failed (the cause in the message, not a `source()`: printed with its chain,
    /// an OS error would be said twice).
    #[error("a listener failed: {0}")]
    Io(std::io::Error),
    /// A background task ended before shutdown: the gateway cannot deliver anymore.
    #[error("{0}; the gateway stops so that it is restarted")]
    Stopped(String),
}

impl From<std::io::Error> for GatewayError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

/// A platform's webhook receiver, shared.
pub type SharedSource = Arc<dyn WebhookSource>;

/// What a route does with an event older than one already applied for its chat (by creation
/// time): a "left the group" that arrives after a later "joined" must not undo it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleEvents {
    /// Deliver every event, in queue order.
    Deliver,
    /// Drop an event older than the chat's watermark (counted).
    Drop,
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
    pub(crate) store: Arc<S>,
    /// The claim protocol on `store`: every claim, renewal and settling goes through it.
    pub(crate) once: Once<S>,
    /// The routes in force: a reload swaps them whole.
    pub(crate) routes: Arc<arc_swap::ArcSwap<route::Routes>>,
    pub(crate) timing: Timing,
    pub(crate) stats: Arc<Stats>,
    /// Woken when a partition may have work: an admit, an ack that frees a chat.
    pub(crate) wake: Vec<Notify>,
    pub(crate) clock: Arc<dyn Clock>,
    /// Connection bounds and deadlines.
    pub(crate) limits: ServerLimits,
    /// Rate-limited log lines for refusals and repeated failures.
    pub(crate) summaries: Arc<Summaries>,
    /// Beyond this many queued events ingress answers 503 (`u64::MAX`: none); reloadable.
    pub(crate) max_queued: AtomicU64,
    /// Queued events, as last sampled from the store plus admits since.
    pub(crate) queued: AtomicU64,
    /// The attempts of events that failed at least once, for `/admin/record`.
    pub(crate) attempts: base::attempts::Attempts,
    /// Where spans go (`[telemetry]`), if anywhere.
    pub(crate) traces: base::traces::Traces,
    /// Set when a background task ended early: readiness fails from then on.
    pub(crate) failure: OnceLock<String>,
    /// What this configuration can lose or expose by design beyond the store's own promise
    /// (the configuration checks' `AtRisk` findings, each "setting: why"), said in `/readyz`
    /// (check-config and the start say it too).
    pub(crate) at_risk: arc_swap::ArcSwap<Vec<String>>,
    /// Per-event metrics, their handles registered once.
    pub(crate) meters: Arc<base::meters::Meters>,
    /// What seals payloads, results and shared values at rest (`[store.encryption]`): the store
    /// wrapper's, and the spool's before it.
    pub(crate) at_rest: Option<Arc<base::at_rest::AtRest>>,
    /// The ingress wing's own state: sources, replay limits, the spool, long connections.
    pub(crate) ingress: ingress::IngressState,
    /// The API wing's: callers, limits, senders and their budgets.
    pub(crate) api: api::ApiState,
    /// The admin wing's: its token, the metrics, the sampled queue and history.
    pub(crate) admin: admin::AdminState,
    /// The configuration in force and how to read it again.
    pub(crate) reload: reload::ReloadState,
}

impl<S: Store> Shared<S> {
    /// A source of `platform`: what reads an event's platform-specific parts (its versions).
    pub(crate) fn platform_source(&self, platform: &str) -> Option<SharedSource> {
        self.ingress
            .sources
            .load()
            .by_name
            .values()
            .map(|source| &source.decoder)
            .find(|decoder| decoder.platform() == platform)
            .cloned()
    }

    /// The first route that takes an event of `event_type` owned by `owner`
    /// ([`registry::owner::of`]), in the routes in force now.
    pub(crate) fn route_for(
        &self,
        event_type: &str,
        owner: oncegate_core::Owner<'_>,
    ) -> Option<Arc<Route>> {
        self.routes.load().route_for(event_type, owner).cloned()
    }

    /// Changes the routes of a gateway not yet running (its builder).
    fn edit_routes(
        &self,
        edit: impl FnOnce(&mut Vec<Route>) -> Result<(), GatewayError>,
    ) -> Result<(), GatewayError> {
        let mut list: Vec<Route> = self
            .routes
            .load()
            .list
            .iter()
            .map(|route| Route::clone(route))
            .collect();
        edit(&mut list)?;
        let bots = self.routes.load().bots.clone();
        self.routes.store(Arc::new(
            route::Routes::of(list.into_iter().map(Arc::new).collect()).with_bots(bots),
        ));
        Ok(())
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn wake(&self, partition: u16) {
        if let Some(notify) = self.wake.get(usize::from(partition)) {
            notify.notify_one();
        }
    }

    /// Marks the gateway as broken (readiness fails) and says why, once.
    pub(crate) fn fail(&self, reason: String) {
        tracing::error!("{reason}");
        let _ = self.failure.set(reason);
    }
}

/// A gateway over the store `S`.
pub struct Gateway<S> {
    /// Everything runs on the store wrapped in `Timed`: each of its calls is measured.
    shared: Arc<Shared<base::timed_store::Timed<S>>>,
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
    pub sources: Vec<(String, SharedSource)>,
    /// The replay guard's limits; `None` turns it off.
    pub replay: Option<ReplayLimits>,
    /// Timing.
    pub timing: Timing,
    /// Largest body.
    pub body_limit: usize,
    /// Admin bearer token.
    pub admin_token: Option<String>,
    /// Connection bounds and deadlines.
    pub limits: ServerLimits,
    /// Beyond this many queued events ingress answers 503; `None`: no bound.
    pub max_queued: Option<u64>,
    /// How often refusals and repeated failures are summarized in the log.
    pub log_interval: Duration,
    /// Deduplicate on events' secondary keys too (`dedup.message_id`).
    pub secondary_keys: bool,
    /// The gateway's clock (replay windows, creation times, retries); the store has its own.
    pub clock: Arc<dyn Clock>,
}

impl GatewayParts {
    /// The parts `config` describes, but for its sources and secrets.
    fn of(config: &Config) -> Self {
        Self {
            sources: Vec::new(),
            replay: config.replay.enabled.then_some(ReplayLimits {
                max_skew: config.replay.max_skew,
                max_nonces: config.replay.max_nonces,
                shared_nonces: config.replay.shared_nonces,
            }),
            timing: Timing {
                retention: config.dedup.retention,
                lease: config.lease.duration,
                renew_every: config.lease.renew_every,
                dispatcher: config.dispatcher.clone(),
            },
            body_limit: config.server.body_limit,
            admin_token: None,
            limits: ServerLimits {
                max_connections: config.server.max_connections,
                header_timeout: config.server.header_timeout,
                body_timeout: config.server.body_timeout,
                shutdown_grace: config.dispatcher.shutdown_grace,
            },
            max_queued: config.dispatcher.max_queued,
            log_interval: config.server.log_interval,
            secondary_keys: config.dedup.message_id,
            clock: Arc::new(SystemClock),
        }
    }
}

impl Default for GatewayParts {
    fn default() -> Self {
        Self::of(&Config::default())
    }
}

impl<S: Store> Gateway<S> {
    /// A gateway with no routes yet.
    pub fn new(store: S, parts: GatewayParts) -> Self {
        let partitions = store.partitions();
        let sources = parts
            .sources
            .into_iter()
            .map(|(name, decoder)| (name, Arc::new(Source::new(decoder, parts.replay))))
            .collect();
        let store = Arc::new(base::timed_store::Timed::new(store));
        let stats = Arc::new(Stats::default());
        let meters = Arc::new(base::meters::Meters::default());
        let once = Once::new(store.clone())
            .with_lease(parts.timing.lease)
            .with_retention(parts.timing.retention)
            .with_observer(Arc::new(base::meters::Counting {
                stats: stats.clone(),
                meters: meters.clone(),
            }));
        Self {
            shared: Arc::new(Shared {
                store,
                once,
                routes: Arc::default(),
                timing: parts.timing,
                stats,
                wake: (0..partitions).map(|_| Notify::new()).collect(),
                clock: parts.clock,
                limits: parts.limits,
                summaries: Arc::new(Summaries::new(parts.log_interval)),
                max_queued: AtomicU64::new(parts.max_queued.unwrap_or(u64::MAX)),
                queued: AtomicU64::new(0),
                attempts: base::attempts::Attempts::default(),
                traces: base::traces::Traces::default(),
                failure: OnceLock::new(),
                at_risk: arc_swap::ArcSwap::default(),
                at_rest: None,
                meters,
                ingress: ingress::IngressState {
                    sources: arc_swap::ArcSwap::from_pointee(ingress::Sources::of(sources)),
                    replay: parts.replay,
                    secondary_keys: parts.secondary_keys,
                    spool: None,
                    spooled: Notify::new(),
                    #[cfg(feature = "long-connection")]
                    long_sources: Vec::new(),
                    body_limit: parts.body_limit,
                    tenant_depths: Default::default(),
                },
                api: api::ApiState::default(),
                admin: admin::AdminState {
                    token: parts.admin_token,
                    ..Default::default()
                },
                reload: reload::ReloadState::default(),
            }),
        }
    }

    fn shared_mut(&mut self) -> Result<&mut Shared<base::timed_store::Timed<S>>, GatewayError> {
        Arc::get_mut(&mut self.shared)
            .ok_or_else(|| GatewayError::Config("configure the gateway before running it".into()))
    }

    /// Adds a route: events whose type matches one of `patterns` (exact, `prefix*` or `*`) go
    /// to `sink`; `stale` says what happens to an event older than one already applied for its
    /// chat.
    pub fn route(
        self,
        patterns: &[&str],
        sink: SharedSink,
        stale: StaleEvents,
    ) -> Result<Self, GatewayError> {
        self.retrying_route(patterns, sink, stale, Retries::default())
    }

    /// [`Gateway::route`], its failed deliveries retried as `retries` says (a schedule of
    /// waits, and how long a failing event may hold its chat's later events back).
    pub fn retrying_route(
        mut self,
        patterns: &[&str],
        sink: SharedSink,
        stale: StaleEvents,
        retries: Retries,
    ) -> Result<Self, GatewayError> {
        let mut route = Route::new(patterns, sink, stale, false);
        route.retries = retries;
        self.shared_mut()?.edit_routes(|routes| {
            routes.push(route);
            Ok(())
        })?;
        Ok(self)
    }

    /// Narrows the route added last to the events of `tenants` (a Feishu `tenant_key`, a
    /// WeCom corp id) and `agents` (a WeCom AgentID), matched exactly; empty: every one's.
    pub fn owned_by(mut self, tenants: &[&str], agents: &[&str]) -> Result<Self, GatewayError> {
        self.shared_mut()?.edit_routes(|routes| {
            let route = routes.last_mut().ok_or_else(|| {
                GatewayError::Config("owned_by narrows a route: add the route first".into())
            })?;
            route.tenants = tenants.iter().map(|t| (*t).to_owned()).collect();
            route.agents = agents.iter().map(|a| (*a).to_owned()).collect();
            Ok(())
        })?;
        Ok(self)
    }

    /// Adds a replying route: events whose type matches go to `sink` as they arrive, and its
    /// answer is the platform's passive reply (WeCom, WeChat), within the platform's deadline.
    /// They are not queued: a repeat gets the stored answer, a failure is answered as one and
    /// the platform retries.
    pub fn replying_route(
        mut self,
        patterns: &[&str],
        sink: SharedSink,
    ) -> Result<Self, GatewayError> {
        let route = Route::new(patterns, sink, StaleEvents::Deliver, true);
        self.shared_mut()?.edit_routes(|routes| {
            routes.push(route);
            Ok(())
        })?;
        Ok(self)
    }

    /// Records one trace per event (and spans of `/send` and `/keys` calls) with `traces`.
    pub fn traces(mut self, traces: Traces) -> Result<Self, GatewayError> {
        self.shared_mut()?.traces = traces;
        Ok(self)
    }

    /// Spools accepted admissions to `spool` while the store cannot be reached (answering 200
    /// instead of 503) and hands them to the store, in order, when it answers again.
    pub fn spool(mut self, spool: Spool) -> Result<Self, GatewayError> {
        self.shared_mut()?.ingress.spool = Some(Arc::new(spool));
        Ok(self)
    }

    /// Serves Prometheus metrics from `render` at the admin listener's `/metrics`.
    pub fn metrics(
        mut self,
        render: impl Fn() -> String + Send + Sync + 'static,
    ) -> Result<Self, GatewayError> {
        self.shared_mut()?.admin.metrics_render = Some(Box::new(render));
        Ok(self)
    }

    /// Judges time by `clock` (replay windows, creation times, retries, `/keys` leases): the
    /// store's clock, so that the gateway and its store agree — on Redis, the server's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Result<Self, GatewayError> {
        self.shared_mut()?.clock = clock;
        Ok(self)
    }

    /// The counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store.inner
    }

    /// The callback routes (`/webhook/<source>`), for serving elsewhere or calling in process.
    pub fn webhooks_router(&self) -> axum::Router {
        ingress::router(self.shared.clone())
    }

    /// Adds a caller of the API (`/keys`) with its bearer token; callers of one namespace
    /// share their keys.
    pub fn api_caller(
        mut self,
        name: &str,
        namespace: &str,
        token: &str,
    ) -> Result<Self, GatewayError> {
        if token.trim().is_empty() {
            return Err(GatewayError::Config(format!(
                "api caller {name:?}: the token is empty"
            )));
        }
        self.shared_mut()?
            .api
            .callers
            .push(api::callers::Caller::new(name, namespace, token));
        Ok(self)
    }

    /// Whether any caller may use the API: only then is it served.
    pub fn has_api(&self) -> bool {
        !self.shared.api.callers.is_empty()
    }

    /// The API routes (`/keys/*`), for serving elsewhere or calling in process.
    pub fn api_router(&self) -> axum::Router {
        api::router(self.shared.clone())
    }

    /// The admin routes (health, readiness, metrics, `/admin/*`).
    pub fn admin_router(&self) -> axum::Router {
        admin::router(self.shared.clone())
    }
}
