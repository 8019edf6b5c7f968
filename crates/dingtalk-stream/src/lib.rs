//! DingTalk's Stream mode (Stream 模式): oncegate dials DingTalk instead of being called, as
//! `shared/protocols/sources.md` §1c describes it.
//!
//! Registration (`POST /v1.0/gateway/connections/open` with the app's Client ID and Secret)
//! hands out an endpoint and a ticket that opens one connection within 90 s; frames are JSON
//! text; `SYSTEM` pings are echoed, a `disconnect` is acked and the connection replaced with one
//! on a new ticket; events and robot messages are acked only once the gateway admitted them
//! (an event that was not is acked `LATER`, and DingTalk pushes it again). What an event
//! becomes is the gateway's business, behind [`Inlet`]; what a frame means is
//! [`oncegate_dingtalk::stream`]'s.
//!
//! [`local`] is a DingTalk-like registration endpoint and Stream server, for tests.

mod client;
mod connection;
pub mod local;
mod register;
mod transport;

use std::time::Duration;

pub use oncegate_core::Inlet;
pub use oncegate_longconn::Status;

pub use client::{SetupError, StreamConnection};
pub use register::{ConnectError, Ticket};
pub use transport::StreamTransport;

/// Where Stream mode registers unless a domain is configured.
pub const DEFAULT_DOMAIN: &str = "https://api.dingtalk.com";

/// The settings of one app's Stream connection.
#[derive(Clone)]
pub struct Settings {
    /// The configured source's name: the label of its metrics and log lines.
    pub source: String,
    /// [`DEFAULT_DOMAIN`], or a local server.
    pub domain: String,
    /// The app's Client ID (AppKey).
    pub client_id: String,
    /// The app's Client Secret, sent to the registration only.
    pub client_secret: String,
    /// Events admitted at once; events of one conversation always one after another.
    pub lanes: usize,
    /// Deadline of the registration and of the WebSocket handshake.
    pub connect_timeout: Duration,
    /// A WebSocket ping goes out this often, so that a half-open connection is noticed.
    pub ping_every: Duration,
    /// Nothing heard for this long (no frame, no pong): the connection is taken for dead and
    /// replaced.
    pub silence: Duration,
    /// After a `disconnect`, how long the acks of events already taken may still go out.
    pub drain: Duration,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("source", &self.source)
            .field("domain", &self.domain)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The defaults for the app `client_id` with `client_secret`, registering at `domain`.
    pub fn new(source: &str, domain: &str, client_id: &str, client_secret: &str) -> Self {
        Self {
            source: source.to_owned(),
            domain: domain.trim_end_matches('/').to_owned(),
            client_id: client_id.to_owned(),
            client_secret: client_secret.to_owned(),
            lanes: 16,
            connect_timeout: Duration::from_secs(10),
            ping_every: Duration::from_secs(20),
            silence: Duration::from_secs(60),
            drain: Duration::from_secs(8),
        }
    }
}
