//! oncegate as a Rust library: a bot whose handlers run once per event.
//!
//! A [`Bot`] is a gateway built from the same public pieces as the `oncegate` binary: sources
//! that verify and decode callbacks, a store (memory, the embedded journal, Redis), the
//! dispatcher that keeps each chat's order — and handlers registered per event type instead
//! of HTTP sinks. Serve its routes on your own axum app ([`Bot::router`] beside
//! [`Bot::run`]), or on a listener of its own ([`Bot::serve`]).
//!
//! ```no_run
//! use oncegate_gateway::bot::{Bot, Ctx};
//! use oncegate_feishu::{Cloud, FeishuApp, events::MessageReceived};
//! use oncegate_memory::MemoryStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let app = FeishuApp::new(Cloud::Feishu, "cli_a1", Some("encrypt-key".into()), None)?;
//! let bot = Bot::builder(MemoryStore::new())
//!     .source("bot", app) // POST /webhook/bot
//!     .on_typed(|message: MessageReceived, ctx: Ctx| async move {
//!         let order = message.message.text().unwrap_or_default();
//!         // Two messages that mean the same order create it once.
//!         ctx.once(&format!("order:{order}"), || async { Ok(None) }).await?;
//!         Ok(())
//!     })
//!     .build()?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! bot.serve(listener, Default::default()).await?;
//! # Ok(()) }
//! ```

mod ctx;
mod handlers;
#[cfg(feature = "send")]
mod send;

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use oncegate_core::{FromEvent, Store, WebhookSource};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use ctx::{BoxFuture, Ctx, HandlerError};
pub use handlers::{EventHandler, IntoReply};
/// Which gateways of several hold a long connection ([`BotBuilder::long_connection`]).
pub use oncegate_config::Instances;
#[cfg(feature = "send")]
pub use send::{NotSent, Priority, RUST_NAMESPACE, SendOptions, Sent};

use crate::{Gateway, GatewayError, GatewayParts, StaleEvents};
use handlers::{FnHandler, Handlers, Registered, TypedHandler};

/// How long one handler may run on one event unless the builder says otherwise
/// ([`BotBuilder::handler_timeout`]).
pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(300);

/// Builds a [`Bot`]: its store, its sources, its handlers.
pub struct BotBuilder<S> {
    store: S,
    parts: GatewayParts,
    handlers: Vec<Registered>,
    handler_timeout: Duration,
    #[cfg(feature = "send")]
    senders: Vec<(String, oncegate_send::Api)>,
    #[cfg(feature = "long-connection")]
    long_connections: Vec<(String, Box<dyn oncegate_longconn::Transport>, Instances)>,
}

impl<S: Store> BotBuilder<S> {
    /// Takes callbacks for `source` at `POST /webhook/<name>` (a `FeishuApp`, `WecomApp`,
    /// `WechatApp`, or any [`WebhookSource`]).
    #[must_use]
    pub fn source(mut self, name: &str, source: impl WebhookSource + 'static) -> Self {
        self.parts.sources.push((name.to_owned(), Arc::new(source)));
        self
    }

    /// Holds `transport`'s long connection as source `name`: a Feishu or Lark app's
    /// (`oncegate_feishu_ws::FeishuTransport`), a WeCom AI bot's
    /// (`oncegate_wecom_ws::AiBotTransport`), DingTalk's Stream mode
    /// (`oncegate_dingtalk_stream::StreamTransport`), or any other [`oncegate_longconn::Transport`].
    /// With [`Instances::Leader`] one instance of several on a shared store holds it.
    #[cfg(feature = "long-connection")]
    #[must_use]
    pub fn long_connection(
        mut self,
        name: &str,
        transport: impl oncegate_longconn::Transport,
        instances: Instances,
    ) -> Self {
        self.long_connections
            .push((name.to_owned(), Box::new(transport), instances));
        self
    }

    /// How long one handler may run on one event ([`HANDLER_TIMEOUT`] unless set): a handler
    /// still running then is stopped and the event retried as after a transient failure, so
    /// that a hung handler holds its chat only until its retries are spent (then the event is
    /// a dead letter and the chat moves on).
    #[must_use]
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// Changes the gateway's parts (timing, limits, replay guard) before it is built.
    #[must_use]
    pub fn parts(mut self, change: impl FnOnce(&mut GatewayParts)) -> Self {
        change(&mut self.parts);
        self
    }

    /// Sends as `api` under `name` ([`Bot::send`], [`Ctx::send`]): a Feishu or Lark app
    /// (`oncegate_send::FeishuApi`), a WeCom agent (`oncegate_send::WecomApi`).
    #[cfg(feature = "send")]
    #[must_use]
    pub fn sender(mut self, name: &str, api: oncegate_send::Api) -> Self {
        self.senders.push((name.to_owned(), api));
        self
    }

    /// Runs `handler` for events whose type matches `pattern` (exact, `prefix*` or `*`).
    /// Several handlers may take one event: each runs once per event, in the order they were
    /// registered.
    #[must_use]
    pub fn on<F, Fut, R>(self, pattern: &str, handler: F) -> Self
    where
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, HandlerError>> + Send + 'static,
        R: IntoReply,
    {
        self.register(&[pattern], FnHandler(handler))
    }

    /// Runs `handler` for the events of `T`'s family, read as a `T`
    /// (`oncegate_feishu::events::MessageReceived`, `oncegate_wecom::events::Text`, …).
    #[must_use]
    pub fn on_typed<T, F, Fut, R>(self, handler: F) -> Self
    where
        T: FromEvent + Send + 'static,
        F: Fn(T, Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, HandlerError>> + Send + 'static,
        R: IntoReply,
    {
        self.register(T::EVENT_TYPES, TypedHandler(handler, PhantomData))
    }

    /// Runs `handler` (a trait object, which may name a business key) for events whose type
    /// matches `pattern`.
    #[must_use]
    pub fn handler(self, pattern: &str, handler: impl EventHandler) -> Self {
        self.register(&[pattern], handler)
    }

    fn register(mut self, patterns: &[&str], handler: impl EventHandler) -> Self {
        let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
        // Its name keys its runs: the same registration order names it the same after a
        // restart.
        let name = format!("{}#{}", patterns.join(","), self.handlers.len());
        self.handlers.push(Registered {
            patterns,
            name,
            handler: Arc::new(handler),
        });
        self
    }

    /// The bot. Events no handler takes are completed without a call.
    pub fn build(self) -> Result<Bot<S>, GatewayError> {
        #[cfg(feature = "long-connection")]
        let connected = !self.long_connections.is_empty();
        #[cfg(not(feature = "long-connection"))]
        let connected = false;
        if self.parts.sources.is_empty() && !connected {
            return Err(GatewayError::Config(
                "a bot needs a source: add one with .source(name, app) or \
                 .long_connection(name, transport, instances)"
                    .into(),
            ));
        }
        if self.handler_timeout.is_zero() {
            return Err(GatewayError::Config(
                "handler_timeout is zero: no handler could finish".into(),
            ));
        }
        #[cfg_attr(
            not(any(feature = "send", feature = "long-connection")),
            allow(unused_mut)
        )]
        let mut gateway = Gateway::new(self.store, self.parts);
        #[cfg(feature = "long-connection")]
        for (name, transport, instances) in self.long_connections {
            gateway.shared_mut()?.ingress.long_sources.push(
                crate::ingress::longconn::LongSource::boxed(&name, transport, instances),
            );
        }
        #[cfg(feature = "send")]
        for (name, api) in self.senders {
            let sender = crate::api::outbox::Sender::of(api).ok_or_else(|| {
                GatewayError::Config(format!(
                    "sender {name:?}: an AI bot sends over its long connection, not as a sender"
                ))
            })?;
            gateway.shared_mut()?.api.add_sender(name, sender);
        }
        #[cfg(feature = "send")]
        let outbox = Arc::new(send::Later(std::sync::OnceLock::new()));
        let patterns: Vec<String> = self
            .handlers
            .iter()
            .flat_map(|r| r.patterns.iter().cloned())
            .collect();
        let patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
        let sink = Handlers {
            handlers: self.handlers,
            timeout: self.handler_timeout,
            keys: Arc::new(gateway.shared.once.clone()),
            #[cfg(feature = "send")]
            outbox: outbox.clone(),
        };
        let gateway = gateway.route(&patterns, Arc::new(sink), StaleEvents::Deliver)?;
        // Weakly: the gateway holds the handlers that send through it.
        #[cfg(feature = "send")]
        let _ = outbox.0.set(Arc::downgrade(&gateway.shared));
        Ok(Bot { gateway })
    }
}

/// A bot: callbacks in, handlers run once per event, per chat in order.
pub struct Bot<S> {
    gateway: Gateway<S>,
}

impl<S: Store> Bot<S> {
    /// A bot on `store` (`MemoryStore::new()`, an `EmbeddedStore` in a folder, a
    /// `RedisStore` shared by every instance).
    pub fn builder(store: S) -> BotBuilder<S> {
        BotBuilder {
            store,
            parts: GatewayParts::default(),
            handlers: Vec::new(),
            handler_timeout: HANDLER_TIMEOUT,
            #[cfg(feature = "send")]
            senders: Vec::new(),
            #[cfg(feature = "long-connection")]
            long_connections: Vec::new(),
        }
    }

    /// The callback routes (`POST /webhook/<source>`), to merge into your own axum app; run
    /// [`run`](Self::run) beside it.
    pub fn router(&self) -> axum::Router {
        self.gateway.webhooks_router()
    }

    /// Runs the dispatcher and the background work (long connections, queue sampling) until
    /// `shutdown`; running handlers may finish within the shutdown grace.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), GatewayError> {
        let (dispatched, ()) = tokio::join!(
            self.gateway.dispatch(shutdown.clone()),
            self.gateway.background(shutdown.clone())
        );
        dispatched
    }

    /// Serves the callback routes on `listener` (with the gateway's connection bounds and
    /// deadlines) and runs the bot until `shutdown`.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        let (served, ran) = tokio::join!(
            self.gateway.serve_webhooks(listener, shutdown.clone()),
            self.run(shutdown.clone())
        );
        served.and(ran)
    }

    /// Sends `request` (the body `/send/<source>` takes: `receive_id`, `msg_type`, `content`,
    /// `reply_to`, `update`…) once as sender `source` under `key`, whoever retries it: a repeat
    /// of the key gets the first send's answer ([`Sent::replayed`]), one that comes while the
    /// first is in flight waits for it, another message under the same key is
    /// [`NotSent::Conflict`]. The platforms' rate budgets are kept, shared with every instance
    /// on a shared store.
    #[cfg(feature = "send")]
    pub async fn send(
        &self,
        source: &str,
        key: &str,
        request: serde_json::Value,
        options: SendOptions,
    ) -> Result<Sent, NotSent> {
        send::send(&self.gateway.shared, source, key, request, options).await
    }

    /// The gateway underneath: its counters, store and admin routes.
    pub fn gateway(&self) -> &Gateway<S> {
        &self.gateway
    }
}
