//! What a handler gets: the event (raw and typed), its identity, and business keys that make a
//! side effect happen once — in process, on every store, across instances on Redis.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Event, FromEvent, KeyHash, ShapeError, Store};
use oncegate_once::{Once, OnceKey, Outcome, RunError};

use crate::sink::SinkError;

/// A handler's error: `Transient` (and `RetryAfter`) are retried with backoff, `Permanent`
/// dead-letters the event. The same type as a sink's.
pub type HandlerError = SinkError;

/// A boxed future, for handlers as trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long a business key held by another event's handler is waited for before this event
/// is retried later (its result, when that run ends in time, is this one's too).
const BUSINESS_WAIT: Duration = Duration::from_secs(5);

/// The claim protocol, for handlers that do not know the store's type.
pub(crate) trait Keys: Send + Sync + 'static {
    fn partitions(&self) -> u16;
    fn run_once<'a>(
        &'a self,
        key: OnceKey,
        wait: Duration,
        work: BoxFuture<'a, Result<Option<Bytes>, HandlerError>>,
    ) -> BoxFuture<'a, Result<Outcome, RunError<HandlerError>>>;
}

impl<S: Store> Keys for Once<S> {
    fn partitions(&self) -> u16 {
        self.store().partitions()
    }

    fn run_once<'a>(
        &'a self,
        key: OnceKey,
        wait: Duration,
        work: BoxFuture<'a, Result<Option<Bytes>, HandlerError>>,
    ) -> BoxFuture<'a, Result<Outcome, RunError<HandlerError>>> {
        Box::pin(self.run(key, wait, |_| work))
    }
}

/// Runs `work` once under `key`: the stored result if it ran before, a retry later if it runs
/// elsewhere now.
pub(crate) async fn once_under(
    keys: &dyn Keys,
    key: OnceKey,
    wait: Duration,
    work: BoxFuture<'_, Result<Option<Bytes>, HandlerError>>,
) -> Result<Option<Bytes>, HandlerError> {
    match keys.run_once(key, wait, work).await {
        Ok(Outcome::Ran(result) | Outcome::Done(result)) => Ok(result),
        Ok(Outcome::InFlight { .. }) => Err(SinkError::RetryAfter {
            reason: "its business key is being handled by another event's handler".into(),
            after: Duration::from_secs(1),
        }),
        Ok(Outcome::Conflict) => Err(SinkError::Permanent(
            "its business key was claimed for another payload".into(),
        )),
        Err(RunError::Failed(error)) => Err(error),
        Err(RunError::Panicked) => Err(SinkError::Transient("the handler panicked".into())),
        Err(RunError::Store(error)) => Err(SinkError::Transient(error.to_string())),
        // Ran, not recorded: counted as done here (the effect happened); a later event with
        // the key may run it again, which the log says.
        Err(RunError::Fenced { result }) => {
            tracing::warn!("a business key's work ran, but its lease had been taken over");
            Ok(result)
        }
        Err(RunError::NotRecorded { result, error }) => {
            tracing::warn!(%error, "a business key's work ran but is not recorded as done");
            Ok(result)
        }
    }
}

/// One event, as a handler sees it.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) event: Arc<Event>,
    pub(crate) id: Arc<str>,
    pub(crate) attempt: u32,
    pub(crate) keys: Arc<dyn Keys>,
    #[cfg(feature = "send")]
    pub(crate) outbox: Arc<dyn super::send::Outbox>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("event_type", &self.event.event_type)
            .field("event_id", &self.event.event_id)
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// The event: platform, app, ids, chat, and the raw payload (JSON or XML).
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The event read as a `T` (`oncegate_feishu::events::MessageReceived`, …).
    pub fn typed<T: FromEvent>(&self) -> Result<T, ShapeError> {
        T::from_event(&self.event)
    }

    /// The event's idempotency key: the same on every attempt and every copy of the event,
    /// for a downstream that deduplicates too.
    pub fn idempotency_key(&self) -> &str {
        &self.id
    }

    /// Which attempt this is, from 0.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Sends `request` once as sender `source` under `key` ([`Bot::send`](super::Bot::send)):
    /// a key made of this event's [`idempotency_key`](Self::idempotency_key) sends once however
    /// often the handler is retried.
    #[cfg(feature = "send")]
    pub async fn send(
        &self,
        source: &str,
        key: &str,
        request: serde_json::Value,
        options: super::SendOptions,
    ) -> Result<super::Sent, super::NotSent> {
        self.outbox.send(source, key, request, options).await
    }

    /// Runs `work` once for `business_key` — whichever event, handler or instance asks — and
    /// answers its result: two events that mean the same order create it once. While another
    /// handler runs it, this one waits a few seconds for its result, then is retried later.
    /// `work`'s error gives the key back, and fails this handler with it.
    pub async fn once<F, Fut>(
        &self,
        business_key: &str,
        work: F,
    ) -> Result<Option<Bytes>, HandlerError>
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<Option<Bytes>, HandlerError>> + Send,
    {
        once_for(self, business_key, Box::pin(work())).await
    }
}

/// A business key's record: the same for every handler, event and platform that names it.
pub(crate) fn business(key: &str) -> KeyHash {
    KeyHash::of(&["bot", "business", key])
}

/// A business key for a whole handler (`EventHandler::business_key`): waits as
/// [`Ctx::once`] does.
pub(crate) async fn once_for(
    ctx: &Ctx,
    business_key: &str,
    work: BoxFuture<'_, Result<Option<Bytes>, HandlerError>>,
) -> Result<Option<Bytes>, HandlerError> {
    let key = business(business_key);
    let key = OnceKey::new(key, key.home(ctx.keys.partitions()));
    once_under(&*ctx.keys, key, BUSINESS_WAIT, work).await
}
