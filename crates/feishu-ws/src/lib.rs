//! The Feishu/Lark long connection (长连接): oncegate dials Feishu instead of being called.
//!
//! Endpoint discovery with the app's credentials, the `pbbp2` frame codec, fragment
//! reassembly, pings with a tolerant pong watchdog, reconnects on the server's settings, and
//! acks that are sent only once the event was admitted. What an event becomes is the
//! gateway's business, behind [`Inlet`]: this crate knows no store.
//!
//! [`local`] is a Feishu-like endpoint and WebSocket server, for tests and `oncegate simulate`.

mod client;
mod connection;
pub mod endpoint;
pub mod fragments;
pub mod frame;
pub mod local;
mod seen;
mod transport;

use std::time::Duration;

pub use oncegate_core::Inlet;
pub use oncegate_longconn::Status;
pub(crate) use oncegate_longconn::unix_ms;

pub use client::{LongConnection, SetupError};
pub use endpoint::{ClientConfig, ConnectError, Endpoint};
pub use fragments::FragmentLimits;
pub use frame::{Frame, FrameError, Header};
pub use transport::FeishuTransport;

/// At most this many connections per app: Feishu refuses more.
pub const MAX_CONNECTIONS: usize = 50;

/// The settings of one app's long connection.
#[derive(Clone)]
pub struct Settings {
    /// The configured source's name: the label of its metrics and log lines.
    pub source: String,
    /// `https://open.feishu.cn`, `https://open.larksuite.com`, or a local server.
    pub domain: String,
    /// The app secret, sent to the endpoint only.
    pub app_secret: String,
    /// Connections held at once (1 to [`MAX_CONNECTIONS`]).
    pub connections: usize,
    /// How long past a ping interval the connection may stay silent before it is taken for
    /// dead; `None`: half the ping interval, between 5 s and 60 s.
    pub pong_grace: Option<Duration>,
    /// Bounds of pending fragments, per connection.
    pub fragments: FragmentLimits,
    /// Events of one connection admitted at once; events of one chat always one after another.
    pub lanes: usize,
    /// A card action's answer must be in its ack within this.
    pub card_deadline: Duration,
    /// Deadline of endpoint discovery and of the WebSocket handshake.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("source", &self.source)
            .field("domain", &self.domain)
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Settings with the defaults but for what must be given.
    pub fn new(source: &str, domain: &str, app_secret: &str) -> Self {
        Self {
            source: source.to_owned(),
            domain: domain.to_owned(),
            app_secret: app_secret.to_owned(),
            connections: 1,
            pong_grace: None,
            fragments: FragmentLimits::default(),
            lanes: 64,
            // Feishu waits 3 s; the ack must still travel back.
            card_deadline: Duration::from_millis(2_500),
            connect_timeout: Duration::from_secs(15),
        }
    }

    /// How long a connection may stay silent: a ping interval plus the grace.
    pub(crate) fn silence_limit(&self, config: &ClientConfig) -> Duration {
        let ping = config.ping_every();
        let grace = self
            .pong_grace
            .unwrap_or_else(|| (ping / 2).clamp(Duration::from_secs(5), Duration::from_secs(60)));
        ping + grace
    }
}
