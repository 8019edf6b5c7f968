//! A WeCom AI bot's long connection (智能机器人长连接): oncegate dials WeCom instead of being
//! called. It subscribes with the bot's id and secret, pings every 30 s and takes a connection
//! whose pings go unanswered twice for dead, dials again with backoff and jitter, and admits
//! every message and event in chat order through [`Inlet`] before anything else happens. A
//! `disconnected_event` (another subscribe took the bot over) ends the connection and is told
//! to the caller, which decides whether to dial again: WeCom keeps one connection per bot, so
//! two holders would kick each other for ever. This crate knows no store.
//!
//! [`local`] is an AI-bot server on loopback, for tests and `oncegate simulate`.

mod client;
mod connection;
pub mod frame;
pub mod local;
mod outbound;
mod reply;
mod transport;

use std::time::Duration;

pub use oncegate_core::Inlet;
pub use oncegate_longconn::Status;

pub use client::{AiBotConnection, Ended, SetupError};
pub use outbound::{Outbound, OutboundError};
pub use reply::{CONVERSATION_BUDGETS, MAX_CONTENT, STREAM_LIMIT, conversation_budgets};
pub use transport::AiBotTransport;

/// WeCom's long-connection address.
pub const DEFAULT_URL: &str = "wss://openws.work.weixin.qq.com";

/// The command of a bot's proactive message (to a conversation whose user wrote to it).
pub const SEND: &str = "aibot_send_msg";

/// The settings of one bot's long connection.
#[derive(Clone)]
pub struct Settings {
    /// The configured source's name: the label of its metrics and log lines.
    pub source: String,
    /// `wss://openws.work.weixin.qq.com`, or a local server.
    pub url: String,
    /// The bot's secret, sent in the subscribe frame only.
    pub secret: String,
    /// A ping goes out this often (WeCom drops connections that stop pinging).
    pub ping_every: Duration,
    /// Pings in a row left unanswered before the connection is taken for dead.
    pub missed_pings: u32,
    /// Callbacks admitted at once; one chat's always one after another.
    pub lanes: usize,
    /// Deadline of the handshake and of the subscribe's answer.
    pub connect_timeout: Duration,
    /// How long a replying message's handler may run: WeCom ends a stream 6 minutes after its
    /// first frame, and the last frames need their time.
    pub stream_limit: Duration,
    /// How long a reply whose connection ended waits for the next subscribed connection to go
    /// out on; past it, the reply is not sent and its event stays retryable.
    pub reply_wait: Duration,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("source", &self.source)
            .field("url", &oncegate_core::redact::url(&self.url))
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Settings with the defaults (the official SDK's) but for what must be given.
    pub fn new(source: &str, url: &str, secret: &str) -> Self {
        Self {
            source: source.to_owned(),
            url: url.to_owned(),
            secret: secret.to_owned(),
            ping_every: Duration::from_secs(30),
            missed_pings: 2,
            lanes: 64,
            connect_timeout: Duration::from_secs(15),
            stream_limit: STREAM_LIMIT,
            reply_wait: Duration::from_secs(60),
        }
    }
}
