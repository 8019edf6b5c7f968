//! Handlers and the sink that runs them: several per event type, each once per event — a
//! retry after one handler failed runs only the handlers that did not finish — and a handler
//! that names a business key runs once per key.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{FromEvent, KeyHash};
use oncegate_once::OnceKey;

use super::ctx::{BoxFuture, Ctx, HandlerError, Keys, once_for, once_under};
use crate::sink::{Delivered, Outgoing, Sink, SinkError};

/// Rust code that handles events. Closures are handlers too (see `BotBuilder::on`); implement
/// this for a handler that names a business key.
pub trait EventHandler: Send + Sync + 'static {
    /// Handles one event. `Ok(Some(answer))` is the answer of a synchronous callback (a
    /// Feishu card's); events that are not answered ignore it.
    fn handle(&self, ctx: Ctx) -> BoxFuture<'static, Result<Option<Bytes>, HandlerError>>;

    /// The business key of what this handler does for `ctx`'s event, if it has one: the
    /// handler then runs once per key, whichever event brings it — two events that mean the
    /// same order create it once (seed 000's `IdempotentFeishuEventHandler`).
    fn business_key(&self, ctx: &Ctx) -> Option<String> {
        let _ = ctx;
        None
    }
}

/// What a handler may answer: nothing (`()`), or an answer for a synchronous callback.
pub trait IntoReply {
    /// The answer's bytes, if any.
    fn into_reply(self) -> Option<Bytes>;
}

impl IntoReply for () {
    fn into_reply(self) -> Option<Bytes> {
        None
    }
}

impl IntoReply for Bytes {
    fn into_reply(self) -> Option<Bytes> {
        Some(self)
    }
}

impl IntoReply for Option<Bytes> {
    fn into_reply(self) -> Option<Bytes> {
        self
    }
}

impl IntoReply for serde_json::Value {
    fn into_reply(self) -> Option<Bytes> {
        Some(Bytes::from(self.to_string()))
    }
}

/// A closure over the whole event.
pub(crate) struct FnHandler<F>(pub(crate) F);

impl<F, Fut, R> EventHandler for FnHandler<F>
where
    F: Fn(Ctx) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, HandlerError>> + Send + 'static,
    R: IntoReply,
{
    fn handle(&self, ctx: Ctx) -> BoxFuture<'static, Result<Option<Bytes>, HandlerError>> {
        let ran = (self.0)(ctx);
        Box::pin(async move { ran.await.map(IntoReply::into_reply) })
    }
}

/// A closure over a typed event: an event of the family's types that does not read as one is
/// dead-lettered with the reason (retrying would not change it).
pub(crate) struct TypedHandler<T, F>(pub(crate) F, pub(crate) PhantomData<fn() -> T>);

impl<T, F, Fut, R> EventHandler for TypedHandler<T, F>
where
    T: FromEvent + Send + 'static,
    F: Fn(T, Ctx) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, HandlerError>> + Send + 'static,
    R: IntoReply,
{
    fn handle(&self, ctx: Ctx) -> BoxFuture<'static, Result<Option<Bytes>, HandlerError>> {
        match ctx.typed::<T>() {
            Ok(typed) => {
                let ran = (self.0)(typed, ctx);
                Box::pin(async move { ran.await.map(IntoReply::into_reply) })
            }
            Err(error) => Box::pin(async move { Err(SinkError::Permanent(error.to_string())) }),
        }
    }
}

/// A registered handler: the event types it takes and its name (part of its keys).
pub(crate) struct Registered {
    pub(crate) patterns: Vec<String>,
    pub(crate) name: String,
    pub(crate) handler: Arc<dyn EventHandler>,
}

/// Every handler, as one sink.
pub(crate) struct Handlers {
    pub(crate) handlers: Vec<Registered>,
    /// How long one handler may run on one event.
    pub(crate) timeout: Duration,
    pub(crate) keys: Arc<dyn Keys>,
    #[cfg(feature = "send")]
    pub(crate) outbox: Arc<dyn super::send::Outbox>,
}

impl Handlers {
    /// Runs one handler, under its business key if it names one, for at most `timeout`.
    async fn run_one(
        handler: &dyn EventHandler,
        ctx: Ctx,
        timeout: Duration,
    ) -> Result<Option<Bytes>, HandlerError> {
        let key = handler.business_key(&ctx);
        let claim = ctx.clone();
        // Inside the business key's claim, so that a handler stopped at its timeout gives the
        // key back as any failed run does.
        let timed = async move {
            match tokio::time::timeout(timeout, handler.handle(ctx)).await {
                Ok(ran) => ran,
                Err(_) => Err(SinkError::Transient(format!(
                    "the handler ran longer than its timeout of {timeout:?} and was stopped; \
                     the event is retried"
                ))),
            }
        };
        match key {
            Some(key) => once_for(&claim, &key, Box::pin(timed)).await,
            None => timed.await,
        }
    }

    async fn deliver_all(&self, outgoing: Outgoing<'_>) -> Result<Option<Bytes>, SinkError> {
        let event = outgoing.event;
        let matching: Vec<&Registered> = self
            .handlers
            .iter()
            .filter(|r| oncegate_config::event_type_matches(&r.patterns, &event.event_type))
            .collect();
        let ctx = Ctx {
            event: Arc::new(event.clone()),
            id: Arc::from(outgoing.id),
            attempt: outgoing.attempt,
            keys: self.keys.clone(),
            #[cfg(feature = "send")]
            outbox: self.outbox.clone(),
        };
        // One handler: the event's own key makes it run once.
        if let [only] = matching.as_slice() {
            return Self::run_one(&*only.handler, ctx, self.timeout).await;
        }
        // Several: each under a key of its own within the event's, so that a retry runs only
        // those that did not finish. All run, in order, whatever one of them answers; a
        // failure to retry wins over one that will never succeed.
        let partition = event.partition(self.keys.partitions());
        let mut answer = None;
        let mut failed: Option<SinkError> = None;
        for registered in matching {
            let key = KeyHash::of(&["bot", "handler", outgoing.id, &registered.name]);
            let ran = once_under(
                &*self.keys,
                OnceKey::new(key, partition),
                Duration::ZERO,
                Box::pin(Self::run_one(
                    &*registered.handler,
                    ctx.clone(),
                    self.timeout,
                )),
            )
            .await;
            match ran {
                Ok(reply) => answer = answer.or(reply),
                Err(error) => {
                    let permanent = matches!(error, SinkError::Permanent(_) | SinkError::Gone(_));
                    if failed.as_ref().is_none_or(|f| {
                        matches!(f, SinkError::Permanent(_) | SinkError::Gone(_)) && !permanent
                    }) {
                        failed = Some(error);
                    }
                }
            }
        }
        failed.map_or(Ok(answer), Err)
    }
}

impl Sink for Handlers {
    fn deliver<'a>(&'a self, outgoing: Outgoing<'a>) -> Delivered<'a> {
        Box::pin(self.deliver_all(outgoing))
    }
}
