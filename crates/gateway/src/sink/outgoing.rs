//! One delivery as every sink sees it, the envelope they emit, and the sink contract.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use oncegate_core::Event;

use crate::sink::error::SinkError;

/// One delivery as a sink sees it.
#[derive(Clone, Copy)]
pub struct Outgoing<'a> {
    /// Stable across attempts and restarts: the `Idempotency-Key` and `webhook-id`.
    pub id: &'a str,
    /// The event.
    pub event: &'a Event,
    /// Attempts before this one.
    pub attempt: u32,
    /// Whether the answer is used (card replies); otherwise it is read only to reuse the
    /// connection and thrown away.
    pub wants_answer: bool,
    /// Where the pieces of a streamed answer go as they come (an AI bot's streamed reply);
    /// `None`: a stream is read whole like any answer.
    pub updates: Option<&'a oncegate_core::Updates>,
    /// The W3C `traceparent` of this attempt's span, when traces are recorded: an HTTP sink
    /// sends it, so that the downstream's spans join the event's trace.
    pub traceparent: Option<&'a str>,
    /// Whose the event is (its tenant and agent): an HTTP sink names them in headers and in
    /// its URL's `{tenant}` and `{agent}`.
    pub owner: oncegate_core::Owner<'a>,
}

impl std::fmt::Debug for Outgoing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("id", &self.id)
            .field("event", &self.event)
            .field("attempt", &self.attempt)
            .field("wants_answer", &self.wants_answer)
            .field("streamed", &self.updates.is_some())
            .field("traceparent", &self.traceparent)
            .finish()
    }
}

/// The boxed future a sink returns.
pub type Delivered<'a> =
    Pin<Box<dyn Future<Output = Result<Option<Bytes>, SinkError>> + Send + 'a>>;

/// A destination for events. `Ok(Some(bytes))` is an answer stored for repeats (card replies).
pub trait Sink: Send + Sync + 'static {
    /// Delivers one event.
    fn deliver<'a>(&'a self, outgoing: Outgoing<'a>) -> Delivered<'a>;

    /// The public key receivers verify its deliveries with (`whpk_…`, Standard Webhooks'
    /// `v1a`), if it signs them so: shown by `/admin/routes`.
    fn public_key(&self) -> Option<String> {
        None
    }
}

/// Rust code that handles events, for teams that embed oncegate as a library.
pub trait Handler: Send + Sync + 'static {
    /// Handles one event. Return `Transient` to be retried, `Permanent` to dead-letter it.
    fn handle(
        &self,
        event: &Event,
        idempotency_key: &str,
        attempt: u32,
    ) -> impl Future<Output = Result<Option<Bytes>, SinkError>> + Send;
}

/// A [`Handler`] as a [`Sink`].
#[derive(Debug)]
pub struct HandlerSink<H>(pub H);

impl<H: Handler> Sink for HandlerSink<H> {
    fn deliver<'a>(&'a self, outgoing: Outgoing<'a>) -> Delivered<'a> {
        Box::pin(self.0.handle(outgoing.event, outgoing.id, outgoing.attempt))
    }
}

/// The JSON document every sink emits: the event with its oncegate identity.
#[derive(serde::Serialize)]
struct Envelope<'a> {
    id: &'a str,
    /// Called `source` before 0.1.1: "source" names a configured source everywhere else.
    platform: &'a str,
    app: &'a str,
    tenant: Option<&'a str>,
    event_id: &'a str,
    event_type: &'a str,
    created_at_ms: u64,
    order_key: Option<&'a str>,
    /// Whose the event is among the tenants its platform serves (a WeCom event: its corp and
    /// agent; a Feishu event: its `tenant_key`), as routes match it.
    #[serde(skip_serializing_if = "oncegate_core::Owner::is_empty")]
    owner: oncegate_core::Owner<'a>,
    attempt: u32,
    payload: Payload<'a>,
}

/// The payload as received: JSON embedded as is (validated, never rebuilt), anything else as a
/// string.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Payload<'a> {
    Json(&'a serde_json::value::RawValue),
    Text(std::borrow::Cow<'a, str>),
}

/// The envelope of one delivery, serialized.
pub fn envelope(outgoing: &Outgoing<'_>) -> Vec<u8> {
    let event = outgoing.event;
    let payload = match serde_json::from_slice::<&serde_json::value::RawValue>(&event.payload) {
        Ok(raw) => Payload::Json(raw),
        Err(_) => Payload::Text(String::from_utf8_lossy(&event.payload)),
    };
    let doc = Envelope {
        id: outgoing.id,
        platform: &event.platform,
        app: &event.app,
        tenant: event.tenant.as_deref(),
        event_id: &event.event_id,
        event_type: &event.event_type,
        created_at_ms: event.created_at_ms,
        order_key: event.order_key.as_deref(),
        owner: outgoing.owner,
        attempt: outgoing.attempt,
        payload,
    };
    // Sized for the payload and the fields at once: grown from empty, the line was copied
    // four or five times on its way to a kilobyte.
    let mut line = Vec::with_capacity(event.payload.len() + 256);
    match serde_json::to_writer(&mut line, &doc) {
        Ok(()) => line,
        Err(_) => Vec::new(),
    }
}

/// A shared sink.
pub type SharedSink = Arc<dyn Sink>;

/// The largest answer read from a downstream: card replies are small (Feishu limits them to
/// a few tens of KiB); a larger answer to a card is a failure, to an event it is not read.
pub const MAX_ANSWER: usize = 64 * 1024;
