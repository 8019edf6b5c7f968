//! The seam between the gateway and a platform's long connection: a platform's crate
//! implements [`Transport`], the gateway's registry builds it from configuration, and the
//! gateway holds any of them alike (a leader lease, readiness, the status page), as it serves
//! any [`oncegate_core::WebhookSource`] over HTTP.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use oncegate_core::SharedInlet;
use tokio_util::sync::CancellationToken;

use crate::Status;

/// How a transport's connections stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Shutdown was asked for, or a fatal answer stopped them (said in the [`Status`]).
    Stopped,
    /// The platform ended them because another client subscribed as the same app or bot (a
    /// platform that keeps one connection per bot): dialling again at once would take it back
    /// and start a ping-pong, so the gateway decides.
    TakenOver,
}

/// What a transport's connections run as.
pub type Held<'a> = Pin<Box<dyn Future<Output = Result<Ended, String>> + Send + 'a>>;

/// A platform's long connection (a WebSocket the platform pushes events over), as the gateway
/// holds it: events go to the [`SharedInlet`] (the gateway's one admission path and claim
/// protocol) and are acknowledged to the platform only once it answered.
pub trait Transport: Send + Sync + 'static {
    /// The platform's name (`feishu`, `lark`, `wecom`, `dingtalk`), for the leader lease and
    /// logs.
    fn platform(&self) -> &str;

    /// The app or bot the connections subscribe as: with the platform, the scope of the lease
    /// one gateway of several holds them under.
    fn app(&self) -> &str;

    /// Whether the platform pushes an event again when the gateway refused it. A platform
    /// that does has its events refused at the gateway's queue bound (it retries later); one
    /// that never does (WeCom's AI bot) has them admitted beyond it, since a refusal would
    /// lose them.
    fn redelivers(&self) -> bool;

    /// Holds the connections until `stop` is cancelled or they stop for good, handing events
    /// to `inlet` and saying what they do in `status`. `Err`: the settings cannot make a
    /// connection (said once; nothing was dialled).
    fn hold(&self, inlet: SharedInlet, status: Arc<Status>, stop: CancellationToken) -> Held<'_>;
}
