//! [`WebhookApp`]: a [`Spec`] with its secrets, receiving callbacks as a platform's crate does.

use std::sync::Arc;

use bytes::Bytes;
use oncegate_core::{
    Accepted, Admit, Callback, Decoded, Event, Keys, Method, Refusal, RefusalKind, Reply, Stamp,
    WebhookSource, key_for,
};
use sha2::Digest as _;

use crate::SpecError;
use crate::request::Request;
use crate::spec::{Answer, KeyEncoding, Part, Spec, Time, TimeUnit, Verify};
use crate::verify::{self, Key, Secret, Signed};

/// One configured generic source: its spec, app id and secrets.
pub struct WebhookApp {
    spec: Spec,
    platform: Arc<str>,
    app: Arc<str>,
    secrets: Vec<Secret>,
    success: Reply,
}

impl std::fmt::Debug for WebhookApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookApp")
            .field("platform", &self.platform)
            .field("app", &self.app)
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

impl WebhookApp {
    /// `spec` for the app `app` (what its events' keys are scoped by) with `secrets`, the
    /// current first (any of them verifies: rotation). Refuses a spec whose parts do not fit:
    /// a check without a secret, a timestamp its signature does not cover, a template that
    /// signs an id the events have not.
    pub fn new(spec: Spec, app: &str, secrets: Vec<String>) -> Result<Self, SpecError> {
        let incoherent = |message: String| Err(SpecError::Incoherent(message));
        if app.is_empty() {
            return incoherent("the app id is empty: set app_id".into());
        }
        let (key, key_is) = match &spec.verify {
            Verify::Hmac(hmac) => (
                Key::Mac(hmac.key),
                "base64 (after its whsec_ prefix), as this source's key is",
            ),
            Verify::Ed25519(_) => (
                Key::Ed25519,
                "an Ed25519 public key: 64 hex digits (the app's PUBLIC KEY)",
            ),
            _ => (Key::Mac(KeyEncoding::Text), ""),
        };
        let secrets = secrets
            .iter()
            .map(|text| {
                Secret::new(text, key)
                    .ok_or_else(|| SpecError::Incoherent(format!("a secret is not {key_is}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        match &spec.verify {
            Verify::Nothing if !secrets.is_empty() => {
                return incoherent(
                    "a secret is set but nothing checks it: set where the signature or token is"
                        .into(),
                );
            }
            Verify::Token { .. } | Verify::Hmac(_) | Verify::Ed25519(_) if secrets.is_empty() => {
                return incoherent("this source checks every request and needs its secret".into());
            }
            _ => {}
        }
        if let Some(signed) = spec.verify.signed() {
            if spec.timestamp.is_some() && !signed.uses(&Part::Timestamp) {
                return incoherent(
                    "a timestamp is read but the signature does not cover it (signed has no \
                     {timestamp}): anyone could change it; add {timestamp} or remove timestamp"
                        .into(),
                );
            }
            if signed.uses(&Part::Timestamp) && spec.timestamp.is_none() {
                return incoherent("signed has {timestamp}: set where the timestamp is".into());
            }
            if signed.uses(&Part::Id) && spec.fields.id.is_empty() {
                return incoherent("signed has {id}: set where the event id is".into());
            }
        }
        if spec.fields.id.is_empty() && spec.fields.fingerprint.is_empty() {
            return incoherent(
                "events need an id (id = [\"/event_id\"]) or, without one, the fields that \
                 tell them apart (fingerprint = [...])"
                    .into(),
            );
        }
        let success = match &spec.success {
            Answer::Json(body) => Reply::json(Bytes::from(body.clone())),
            Answer::Text(body) => Reply::text(Bytes::from(body.clone())),
            Answer::Echo(_) => {
                return incoherent("the success answer is fixed: json or text, not an echo".into());
            }
        };
        Ok(Self {
            platform: Arc::from(spec.platform.as_str()),
            app: Arc::from(app),
            spec,
            secrets,
            success,
        })
    }

    /// Whether requests are taken unchecked (said at start, in check-config and `/readyz`).
    pub fn is_unsigned(&self) -> bool {
        self.spec.verify == Verify::Nothing
    }

    fn time_ms(request: &Request<'_>, time: &Time) -> Result<Option<u64>, Refusal> {
        let Some(text) = request.get(&time.at)? else {
            return Ok(None);
        };
        let bad = || {
            Refusal::new(
                RefusalKind::BadInput,
                "bad_time",
                format!(
                    "the time at {} is not a number of {}",
                    time.at,
                    unit(time.unit)
                ),
            )
        };
        let value: f64 = text.trim().parse().map_err(|_| bad())?;
        if !value.is_finite() || value < 0.0 {
            return Err(bad());
        }
        Ok(Some(match time.unit {
            TimeUnit::Seconds => (value * 1000.0) as u64,
            TimeUnit::Milliseconds => value as u64,
        }))
    }

    /// The event's id: its parts joined, or the fingerprint's digest when a part is missing.
    fn event_id(&self, request: &Request<'_>) -> Result<String, Refusal> {
        let fields = &self.spec.fields;
        let mut parts = Vec::with_capacity(fields.id.len());
        for location in &fields.id {
            match request.get(location)? {
                Some(part) => parts.push(part.into_owned()),
                None => {
                    parts.clear();
                    break;
                }
            }
        }
        if !fields.id.is_empty() && parts.len() == fields.id.len() {
            return Ok(parts.join(":"));
        }
        let mut digest = sha2::Sha256::new();
        let mut any = false;
        for location in &fields.fingerprint {
            let value = request.get(location)?;
            any |= value.is_some();
            // Each value with its length: ("ab", "c") and ("a", "bc") differ.
            let value = value.unwrap_or_default();
            digest.update((value.len() as u64).to_be_bytes());
            digest.update(value.as_bytes());
        }
        if !any {
            let wanted: Vec<String> = fields.id.iter().map(|l| l.to_string()).collect();
            return Err(Refusal::new(
                RefusalKind::BadInput,
                "no_event_id",
                format!(
                    "the event has no id at {}{}",
                    wanted.join(" + "),
                    if fields.fingerprint.is_empty() {
                        ": set fingerprint = [...] to key events that carry none"
                    } else {
                        " and none of the fingerprint's fields"
                    }
                ),
            ));
        }
        Ok(oncegate_core::fingerprint_id(&digest.finalize().into()))
    }

    fn event(&self, request: &Request<'_>, id: String) -> Result<Event, Refusal> {
        let fields = &self.spec.fields;
        let mut event_type = Vec::new();
        for location in &fields.event_type {
            if let Some(part) = request.get(location)? {
                event_type.push(part.into_owned());
            }
        }
        let text = |location: &Option<crate::Location>| -> Result<Option<Arc<str>>, Refusal> {
            Ok(match location {
                Some(location) => request.get(location)?.map(|v| Arc::from(v.as_ref())),
                None => None,
            })
        };
        // Without the platform's time, the time it arrived: 0 would read as 1970 — the lag
        // metric's decades, and older than anything a watermark route applied (dropped).
        let created_at_ms = match &fields.created_at {
            Some(time) => Self::time_ms(request, time)?,
            None => None,
        }
        .unwrap_or_else(received_ms);
        Ok(Event {
            platform: self.platform.clone(),
            app: self.app.clone(),
            tenant: text(&fields.tenant)?,
            event_id: Arc::from(id),
            event_type: if event_type.is_empty() {
                Arc::from("webhook")
            } else {
                Arc::from(event_type.join("."))
            },
            created_at_ms,
            order_key: text(&fields.chat)?,
            payload: Bytes::copy_from_slice(request.body()),
        })
    }
}

/// Now, unix milliseconds.
fn received_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn unit(unit: TimeUnit) -> &'static str {
    match unit {
        TimeUnit::Seconds => "seconds",
        TimeUnit::Milliseconds => "milliseconds",
    }
}

impl WebhookSource for WebhookApp {
    fn platform(&self) -> &str {
        &self.platform
    }

    fn decode(&self, callback: &Callback<'_>) -> Result<Decoded, Refusal> {
        if callback.method != Method::Post {
            return Err(Refusal::new(
                RefusalKind::Method,
                "method",
                format!("{} posts its callbacks: use POST", self.platform),
            ));
        }
        let request = Request::new(callback);
        let timestamp = match &self.spec.timestamp {
            Some(time) => Some(request.get(&time.at)?.ok_or_else(|| {
                Refusal::new(
                    RefusalKind::Unauthenticated,
                    "missing_timestamp",
                    format!(
                        "no timestamp at {}: the platform signs one with every request",
                        time.at
                    ),
                )
            })?),
            None => None,
        };
        // Read before the check: what it cannot read is refused as unauthenticated, the one
        // answer an unchecked request gets.
        let signed_id = match self.spec.verify.signed() {
            Some(signed) if signed.uses(&Part::Id) => {
                Some(self.event_id(&request).map_err(|_| {
                    Refusal::new(
                        RefusalKind::Unauthenticated,
                        "missing_signed_id",
                        "no event id where the signature covers one: the platform signs it",
                    )
                })?)
            }
            _ => None,
        };
        let signature = verify::check(
            &self.spec.verify,
            &self.secrets,
            &request,
            &Signed {
                timestamp: timestamp.as_deref(),
                id: signed_id.as_deref(),
            },
        )?;
        let stamp = match (&self.spec.timestamp, signature) {
            (Some(time), Some(nonce)) => {
                let ms = Self::time_ms(&request, time)?.unwrap_or(0);
                Some(Stamp {
                    timestamp_secs: ms / 1000,
                    nonce,
                    request: None,
                })
            }
            _ => None,
        };
        for handshake in &self.spec.handshakes {
            if request.get(&handshake.when)?.as_deref() != Some(handshake.equals.as_str()) {
                continue;
            }
            let answer = match &handshake.answer {
                Answer::Echo(at) => Reply::text(Bytes::from(
                    request
                        .get(at)?
                        .ok_or_else(|| {
                            Refusal::new(
                                RefusalKind::BadInput,
                                "bad_handshake",
                                format!("a handshake without its value at {at}"),
                            )
                        })?
                        .into_owned(),
                )),
                Answer::Json(body) => Reply::json(Bytes::from(body.clone())),
                Answer::Text(body) => Reply::text(Bytes::from(body.clone())),
            };
            return Ok(match stamp {
                Some(stamp) => Decoded::SignedChallenge {
                    answer,
                    timestamp_secs: stamp.timestamp_secs,
                },
                None => Decoded::Challenge(answer),
            });
        }
        let id = match signed_id {
            Some(id) => id,
            None => self.event_id(&request)?,
        };
        let event = self.event(&request, id)?;
        let keys = Keys::new(key_for(
            &self.platform,
            &self.app,
            "event_id",
            &event.event_id,
        ));
        Ok(Decoded::Admit {
            admit: Admit::new(event, keys),
            stamp,
        })
    }

    fn accepted(&self, _: Accepted) -> Reply {
        self.success.clone()
    }

    /// A platform that signs no nonce retries with the same request, and one that signs a
    /// timestamp may too: a copy of an admitted request is answered as the duplicate it is,
    /// never refused (the platform would retry a refusal for as long as it lasts).
    fn retries_repeat_the_request(&self) -> bool {
        true
    }
}
