//! The HTTP sink: the envelope POSTed with Standard Webhooks headers, its answer classified.

use std::time::Duration;

use bytes::Bytes;

use crate::sink::error::{SinkError, SinkSetupError};
use crate::sink::outgoing::MAX_ANSWER;
use crate::sink::outgoing::{Delivered, Outgoing, Sink, envelope};
use crate::sink::sign::Signer;

/// POSTs the envelope with Standard Webhooks headers and an `Idempotency-Key`. Never follows
/// redirects: a 3xx would turn the signed POST into a GET, or post it somewhere else.
pub struct HttpSink {
    client: reqwest::Client,
    url: String,
    /// The URL as it may be shown: no userinfo, no query.
    shown: String,
    signer: Signer,
    timeout: Duration,
}

/// The URL without credentials; never the secret.
impl std::fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("url", &self.shown)
            .field("signed", &self.signer.secret.is_some())
            .field("v1a", &self.signer.signing_key.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl HttpSink {
    /// A sink posting to `url`, signing with `secret` (`whsec_...`) if given.
    pub fn new(url: &str, secret: Option<&str>, timeout: Duration) -> Result<Self, SinkSetupError> {
        // reqwest is built without a default crypto provider: use ring (pure Rust and asm, no
        // C toolchain needed). Installing twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let secret = secret.map(crate::sink::sign::webhook_key).transpose()?;
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
            signer: Signer {
                secret,
                ..Signer::default()
            },
            timeout,
        })
    }
}

impl HttpSink {
    /// Signs every delivery with the Ed25519 key `whsk_…` too (a `v1a` signature, the Standard
    /// Webhooks' asymmetric scheme: receivers verify with the public key, `whpk_…`, and cannot
    /// sign themselves). The key is the 32-byte seed, or the 64-byte seed and public key.
    pub fn with_signing_key(mut self, key: &str) -> Result<Self, SinkSetupError> {
        self.signer.set_signing_key(key)?;
        Ok(self)
    }

    /// [`HttpSink::with_signing_key`] when a key is given.
    pub fn with_signing_key_opt(self, key: Option<&str>) -> Result<Self, SinkSetupError> {
        match key {
            Some(key) => self.with_signing_key(key),
            None => Ok(self),
        }
    }

    /// The `whpk_…` public key receivers verify `v1a` signatures with, if a key is set.
    pub fn public_key(&self) -> Option<String> {
        self.signer.public_key()
    }

    /// Signs with `previous` secrets too, while a receiver moves off them: `webhook-signature`
    /// then holds one `v1` signature per secret, space-separated, the current one first (the
    /// Standard Webhooks rule for rotation). Needs a current secret.
    pub fn with_previous_secrets(mut self, previous: &[&str]) -> Result<Self, SinkSetupError> {
        self.signer.set_previous(previous)?;
        Ok(self)
    }

    /// `v1,<base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}"))>`.
    pub fn sign(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
        crate::sink::sign::sign(key, id, timestamp, body)
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

/// What stands in a URL for an owner it names: every byte but RFC 3986's unreserved ones
/// percent-encoded, so that an id cannot add a path segment, a query or a fragment.
const OWNER_IN_URL: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl HttpSink {
    /// The URL of one delivery: `{tenant}` and `{agent}` replaced by the event's, encoded
    /// (`_` for one it has not). The host never holds them (checked with the configuration).
    fn url_for(&self, owner: oncegate_core::Owner<'_>) -> std::borrow::Cow<'_, str> {
        if !self.url.contains('{') {
            return std::borrow::Cow::Borrowed(&self.url);
        }
        let encode = |id: Option<&str>| match id {
            Some(id) if !id.is_empty() && id != "." && id != ".." => {
                percent_encoding::utf8_percent_encode(id, OWNER_IN_URL).to_string()
            }
            _ => "_".to_owned(),
        };
        std::borrow::Cow::Owned(
            self.url
                .replace("{tenant}", &encode(owner.tenant))
                .replace("{agent}", &encode(owner.agent)),
        )
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
    fn public_key(&self) -> Option<String> {
        HttpSink::public_key(self)
    }

    fn deliver<'a>(&'a self, outgoing: Outgoing<'a>) -> Delivered<'a> {
        Box::pin(async move {
            let body = envelope(&outgoing);
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let url = self.url_for(outgoing.owner);
            let mut request = self
                .client
                .post(url.as_ref())
                .header("content-type", "application/json")
                .header("idempotency-key", outgoing.id)
                .header("webhook-id", outgoing.id)
                .header("webhook-timestamp", timestamp.to_string());
            if let Some(signatures) = self.signer.signatures(outgoing.id, timestamp, &body) {
                request = request.header("webhook-signature", signatures);
            }
            if let Some(traceparent) = outgoing.traceparent {
                request = request.header("traceparent", traceparent);
            }
            // Ids from the platform: sent only as header values they can be.
            for (name, value) in [
                ("oncegate-tenant", outgoing.owner.tenant),
                ("oncegate-agent", outgoing.owner.agent),
            ] {
                if let Some(value) =
                    value.and_then(|v| reqwest::header::HeaderValue::from_str(v).ok())
                {
                    request = request.header(name, value);
                }
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
                && crate::sink::stream::is_event_stream(response.headers())
            {
                return match crate::sink::stream::read(response, updates, MAX_ANSWER).await {
                    Ok(answer) => Ok((!answer.is_empty()).then_some(answer)),
                    Err(crate::sink::stream::StreamError::TooLarge) => Err(SinkError::Permanent(
                        format!("the streamed answer is larger than {MAX_ANSWER} bytes"),
                    )),
                    Err(crate::sink::stream::StreamError::Read(reason)) => Err(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::outgoing::envelope;

    #[test]
    fn an_owner_in_a_url_stays_one_segment_whatever_its_bytes() {
        let sink = HttpSink::new(
            "http://127.0.0.1:9/by/{tenant}/{agent}?t={tenant}",
            None,
            Duration::from_secs(1),
        )
        .expect("sink");
        let url = |tenant, agent| {
            sink.url_for(oncegate_core::Owner { tenant, agent })
                .into_owned()
        };
        assert_eq!(
            url(Some("wpAb-C_d.e~"), Some("1000002")),
            "http://127.0.0.1:9/by/wpAb-C_d.e~/1000002?t=wpAb-C_d.e~"
        );
        assert_eq!(
            url(Some("a/b?c#d&e=f"), None),
            "http://127.0.0.1:9/by/a%2Fb%3Fc%23d%26e%3Df/_?t=a%2Fb%3Fc%23d%26e%3Df"
        );
        assert_eq!(url(Some(".."), Some(".")), "http://127.0.0.1:9/by/_/_?t=_");
        assert_eq!(
            url(Some("企业"), Some("")),
            "http://127.0.0.1:9/by/%E4%BC%81%E4%B8%9A/_?t=%E4%BC%81%E4%B8%9A"
        );
        let plain =
            HttpSink::new("http://127.0.0.1:9/events", None, Duration::from_secs(1)).expect("sink");
        assert!(matches!(
            plain.url_for(oncegate_core::Owner::default()),
            std::borrow::Cow::Borrowed("http://127.0.0.1:9/events")
        ));
    }

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
                traceparent: None,
                owner: oncegate_core::Owner::default(),
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
