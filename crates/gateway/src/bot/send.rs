//! Sending once from Rust: `/send`'s machinery (the caller's key through the claim protocol,
//! the platforms' rate budgets, the platform's own idempotency key) without the HTTP.

use std::sync::{OnceLock, Weak};
use std::time::Duration;

use oncegate_core::Store;
use serde_json::Value;

use crate::Shared;
use crate::api::budget::Lane;
use crate::api::outbox::{self, Sending};
pub use crate::api::outbox::{NotSent, Sent};

/// The namespace of keys sent from Rust unless [`SendOptions::namespace`] names another (an
/// `[[api.caller]]`'s, to share keys with it).
pub const RUST_NAMESPACE: &str = "rust";

/// Which sends go first to one receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Replies and mentions: a person waits for them.
    High,
    /// Notifications: they wait while a reply waits for the same receiver.
    Bulk,
}

/// How a send waits and whose keys it uses.
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// How long it may wait for budgets, the platform's limits and a first send under its key
    /// (10 s unless set, at most `api.max_wait`).
    pub wait: Option<Duration>,
    /// Its lane; unset: replies (`reply_to`) high, the rest bulk.
    pub priority: Option<Priority>,
    /// Whose keys; [`RUST_NAMESPACE`] unless set.
    pub namespace: Option<String>,
}

/// Sends `request` once as `source` under `key` (the body `/send/<source>` takes).
pub(crate) async fn send<S: Store>(
    shared: &Shared<S>,
    source: &str,
    key: &str,
    request: Value,
    options: SendOptions,
) -> Result<Sent, NotSent> {
    let sending = Sending {
        source,
        tenant: None,
        namespace: options.namespace.as_deref().unwrap_or(RUST_NAMESPACE),
        key,
        request,
        wait: options.wait,
        lane: options.priority.map(|priority| match priority {
            Priority::High => Lane::High,
            Priority::Bulk => Lane::Bulk,
        }),
    };
    outbox::send(shared, sending).await
}

/// Sends for handlers, which do not know the store's type. It holds the gateway weakly (the
/// gateway holds the handlers), set once the gateway is built.
pub(crate) trait Outbox: Send + Sync + 'static {
    fn send<'a>(
        &'a self,
        source: &'a str,
        key: &'a str,
        request: Value,
        options: SendOptions,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Sent, NotSent>> + Send + 'a>>;
}

/// The gateway, once built.
pub(crate) struct Later<S>(pub(crate) OnceLock<Weak<Shared<S>>>);

impl<S: Store> Outbox for Later<S> {
    fn send<'a>(
        &'a self,
        source: &'a str,
        key: &'a str,
        request: Value,
        options: SendOptions,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Sent, NotSent>> + Send + 'a>>
    {
        Box::pin(async move {
            let Some(shared) = self.0.get().and_then(Weak::upgrade) else {
                return Err(NotSent::Transient("the bot is not running".into()));
            };
            send(&shared, source, key, request, options).await
        })
    }
}
