//! Where handled events go: an HTTP endpoint (Standard Webhooks), JSON lines, or Rust code.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::Event;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// Why a delivery failed, and so what happens next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Worth retrying later (timeouts, 408, 429, 5xx, refused connections).
    #[error("transient: {0}")]
    Transient(String),
    /// Will never succeed (other 4xx, a handler's verdict): dead-letter it.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The endpoint is gone (410, the Standard Webhooks rule): the route stops delivering
    /// until an operator resumes it.
    #[error("gone: {0}")]
    Gone(String),
    /// Worth retrying, but not before `after`: the downstream said so (`Retry-After` on a 429
    /// or 503). The dispatcher waits at least that long (up to `dispatcher.backoff_max`, or
    /// 10 minutes when that is shorter).
    #[error("transient: {reason}; retry after {after:?}")]
    RetryAfter {
        /// What the downstream answered.
        reason: String,
        /// How long it asked to wait.
        after: std::time::Duration,
    },
}

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
}

impl std::fmt::Debug for Outgoing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("id", &self.id)
            .field("event", &self.event)
            .field("attempt", &self.attempt)
            .field("wants_answer", &self.wants_answer)
            .field("streamed", &self.updates.is_some())
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

/// The largest answer read from a downstream: card replies are small (Feishu limits them to
/// a few tens of KiB); a larger answer to a card is a failure, to an event it is not read.
pub const MAX_ANSWER: usize = 64 * 1024;

/// POSTs the envelope with Standard Webhooks headers and an `Idempotency-Key`. Never follows
/// redirects: a 3xx would turn the signed POST into a GET, or post it somewhere else.
pub struct HttpSink {
    client: reqwest::Client,
    url: String,
    /// The URL as it may be shown: no userinfo, no query.
    shown: String,
    pub(crate) secret: Option<Vec<u8>>,
    /// Secrets being rotated out, signed with too.
    pub(crate) previous: Vec<Vec<u8>>,
    /// The `whsk_` key of asymmetric `v1a` signatures, if set.
    pub(crate) signing_key: Option<ring::signature::Ed25519KeyPair>,
    timeout: Duration,
}

/// The URL without credentials; never the secret.
impl std::fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("url", &self.shown)
            .field("signed", &self.secret.is_some())
            .field("v1a", &self.signing_key.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why an HTTP sink could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SinkSetupError {
    /// The secret is not `whsec_` + base64.
    #[error("the webhook secret must be \"whsec_\" followed by base64")]
    Secret,
    /// The signing key is not `whsk_` + base64 of an Ed25519 key.
    #[error(
        "the signing key must be \"whsk_\" followed by the base64 of an Ed25519 key (its 32-byte seed, or seed and public key)"
    )]
    SigningKey,
    /// Previous secrets are set without a current one.
    #[error("previous_secrets need a current secret: set secret (the new one)")]
    PreviousWithoutSecret,
    /// The HTTP client failed to start.
    #[error("cannot start the HTTP client: {0}")]
    Client(String),
    /// The output file cannot be opened.
    #[error("cannot open {path}: {source}")]
    File {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl HttpSink {
    /// A sink posting to `url`, signing with `secret` (`whsec_...`) if given.
    pub fn new(url: &str, secret: Option<&str>, timeout: Duration) -> Result<Self, SinkSetupError> {
        // reqwest is built without a default crypto provider: use ring (pure Rust and asm, no
        // C toolchain needed). Installing twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let secret = secret.map(crate::sink_sign::webhook_key).transpose()?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .pool_max_idle_per_host(64)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| SinkSetupError::Client(error.without_url().to_string()))?;
        Ok(Self {
            client,
            url: url.to_owned(),
            shown: oncegate_core::redact::url(url),
            secret,
            previous: Vec::new(),
            signing_key: None,
            timeout,
        })
    }
}

/// How an HTTP status is treated.
pub(crate) fn classify(status: u16) -> Result<(), SinkError> {
    match status {
        200..=299 => Ok(()),
        300..=399 => Err(SinkError::Permanent(format!(
            "downstream answered {status}, a redirect: oncegate never follows redirects (the \
             signed POST would become a GET or go elsewhere); point the route's url at the \
             final address"
        ))),
        408 | 429 | 500..=599 => Err(SinkError::Transient(format!(
            "downstream answered {status}"
        ))),
        410 => Err(SinkError::Gone(
            "downstream answered 410 Gone: the endpoint says it will take no more deliveries"
                .into(),
        )),
        other => Err(SinkError::Permanent(format!("downstream answered {other}"))),
    }
}

/// The wait a `Retry-After` header asks for, in seconds (the form downstreams send with 429 and
/// 503); an HTTP date or anything else is not read (the backoff applies), and a wait beyond a
/// day is taken as a day.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<std::time::Duration> {
    let seconds: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(std::time::Duration::from_secs(seconds.min(86_400)))
}

impl Sink for HttpSink {
    fn deliver<'a>(&'a self, outgoing: Outgoing<'a>) -> Delivered<'a> {
        Box::pin(async move {
            let body = envelope(&outgoing);
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut request = self
                .client
                .post(&self.url)
                .header("content-type", "application/json")
                .header("idempotency-key", outgoing.id)
                .header("webhook-id", outgoing.id)
                .header("webhook-timestamp", timestamp.to_string());
            if let Some(signatures) = self.signatures(outgoing.id, timestamp, &body) {
                request = request.header("webhook-signature", signatures);
            }
            let response = request.body(body).send().await.map_err(|error| {
                if error.is_timeout() {
                    SinkError::Transient(format!("no answer within {:?}", self.timeout))
                } else {
                    SinkError::Transient(format!(
                        "cannot reach {}: {}",
                        self.shown,
                        oncegate_core::redact::causes(&error.without_url())
                    ))
                }
            })?;
            let status = response.status().as_u16();
            if let Err(error) = classify(status) {
                return Err(match (error, retry_after(response.headers())) {
                    (SinkError::Transient(reason), Some(after)) => {
                        SinkError::RetryAfter { reason, after }
                    }
                    (error, _) => error,
                });
            }
            if !outgoing.wants_answer {
                // The status said it was delivered; the answer is read only so that the
                // connection can be reused, and not kept.
                discard(response).await;
                return Ok(None);
            }
            if let Some(updates) = outgoing.updates
                && crate::sink_stream::is_event_stream(response.headers())
            {
                return match crate::sink_stream::read(response, updates, MAX_ANSWER).await {
                    Ok(answer) => Ok((!answer.is_empty()).then_some(answer)),
                    Err(crate::sink_stream::StreamError::TooLarge) => Err(SinkError::Permanent(
                        format!("the streamed answer is larger than {MAX_ANSWER} bytes"),
                    )),
                    Err(crate::sink_stream::StreamError::Read(reason)) => Err(
                        SinkError::Transient(format!("reading the streamed answer: {reason}")),
                    ),
                };
            }
            match read_capped(response).await {
                Ok(answer) => Ok((!answer.is_empty()).then_some(answer)),
                Err(AnswerError::TooLarge) => Err(SinkError::Permanent(format!(
                    "the answer is larger than {MAX_ANSWER} bytes"
                ))),
                Err(AnswerError::Read(reason)) => Err(SinkError::Transient(format!(
                    "reading the answer: {reason}"
                ))),
            }
        })
    }
}

enum AnswerError {
    TooLarge,
    Read(String),
}

/// Reads an unwanted answer away, at most [`MAX_ANSWER`] bytes of it (then the connection is
/// dropped rather than read on), without keeping any of it.
async fn discard(mut response: reqwest::Response) {
    let mut read = 0;
    while read <= MAX_ANSWER {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            Ok(None) | Err(_) => return,
        }
    }
}

/// The answer's body, at most [`MAX_ANSWER`] bytes of it; a larger one is not read further.
async fn read_capped(mut response: reqwest::Response) -> Result<Bytes, AnswerError> {
    if response
        .content_length()
        .is_some_and(|length| length > MAX_ANSWER as u64)
    {
        return Err(AnswerError::TooLarge);
    }
    let mut answer = bytes::BytesMut::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| AnswerError::Read(error.without_url().to_string()))?
    {
        if answer.len() + chunk.len() > MAX_ANSWER {
            return Err(AnswerError::TooLarge);
        }
        answer.extend_from_slice(&chunk);
    }
    Ok(answer.freeze())
}

/// Writes one JSON line per event to standard output, or to a file where each line is synced
/// to disk before its event counts as delivered.
#[derive(Debug)]
pub struct LinesSink {
    out: Output,
}

#[derive(Debug)]
enum Output {
    Stdout(Mutex<tokio::io::Stdout>),
    File(crate::sink_file::FileLines),
}

impl LinesSink {
    /// Lines on standard output.
    pub fn stdout() -> Self {
        Self {
            out: Output::Stdout(Mutex::new(tokio::io::stdout())),
        }
    }

    /// Lines appended to `path`.
    pub async fn file(path: &Path) -> Result<Self, SinkSetupError> {
        // 0600 in a 0700 folder when created: the lines hold decrypted messages.
        let file = oncegate_files::open_append(path).map_err(|source| SinkSetupError::File {
            path: path.display().to_string(),
            source,
        })?;
        let name = path.display().to_string();
        let lines = crate::sink_file::FileLines::start(file, name.clone())
            .map_err(|source| SinkSetupError::File { path: name, source })?;
        Ok(Self {
            out: Output::File(lines),
        })
    }
}

impl Sink for LinesSink {
    fn deliver<'a>(&'a self, outgoing: Outgoing<'a>) -> Delivered<'a> {
        Box::pin(async move {
            let mut line = envelope(&outgoing);
            line.push(b'\n');
            match &self.out {
                Output::Stdout(stdout) => {
                    let mut stdout = stdout.lock().await;
                    let written = match stdout.write_all(&line).await {
                        Ok(()) => stdout.flush().await,
                        Err(error) => Err(error),
                    };
                    written
                        .map_err(|error| SinkError::Transient(format!("cannot write: {error}")))?;
                }
                Output::File(file) => file.append(line).await.map_err(SinkError::Transient)?,
            }
            Ok(None)
        })
    }
}

/// A shared sink.
pub type SharedSink = Arc<dyn Sink>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_embeds_json_payloads_as_they_are_and_other_bytes_as_text() {
        let mut event = oncegate_core::Event {
            platform: "feishu".into(),
            app: "cli_x".into(),
            tenant: None,
            event_id: "e1".into(),
            event_type: "im.message.receive_v1".into(),
            created_at_ms: 7,
            order_key: Some("oc_1".into()),
            payload: Bytes::from_static(br#"{"b": 1, "a": [2]}"#),
        };
        let out = |event: &oncegate_core::Event| -> serde_json::Value {
            let outgoing = Outgoing {
                id: "msg_1",
                event,
                attempt: 2,
                wants_answer: false,
                updates: None,
            };
            serde_json::from_slice(&envelope(&outgoing)).expect("json")
        };
        let doc = out(&event);
        assert_eq!(doc["payload"], serde_json::json!({"b": 1, "a": [2]}));
        assert_eq!(
            (
                doc["id"].as_str(),
                doc["attempt"].as_u64(),
                doc["order_key"].as_str()
            ),
            (Some("msg_1"), Some(2), Some("oc_1"))
        );
        event.payload = Bytes::from_static(b"<xml>not json</xml>");
        assert_eq!(out(&event)["payload"], "<xml>not json</xml>");
    }

    #[test]
    fn retry_after_is_read_in_seconds_only() {
        let headers = |value: &str| {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(
                reqwest::header::RETRY_AFTER,
                reqwest::header::HeaderValue::from_str(value).expect("value"),
            );
            headers
        };
        let secs = std::time::Duration::from_secs;
        assert_eq!(retry_after(&headers("30")), Some(secs(30)));
        assert_eq!(retry_after(&headers(" 7 ")), Some(secs(7)));
        assert_eq!(retry_after(&headers("99999999")), Some(secs(86_400)));
        assert_eq!(retry_after(&headers("Wed, 21 Oct 2026 07:28:00 GMT")), None);
        assert_eq!(retry_after(&headers("-1")), None);
        assert_eq!(retry_after(&reqwest::header::HeaderMap::new()), None);
    }

    #[test]
    fn statuses_are_classified() {
        assert_eq!(classify(204), Ok(()));
        assert!(matches!(classify(429), Err(SinkError::Transient(_))));
        assert!(matches!(classify(503), Err(SinkError::Transient(_))));
        assert!(matches!(classify(408), Err(SinkError::Transient(_))));
        assert!(matches!(classify(422), Err(SinkError::Permanent(_))));
        assert!(matches!(classify(301), Err(SinkError::Permanent(_))));
        assert!(matches!(classify(307), Err(SinkError::Permanent(r)) if r.contains("redirect")));
    }
}
