//! Feishu/Lark HTTP callbacks: signature and token checks, AES-256-CBC decryption, the schema 2.0
//! and v1 envelopes, card callbacks, and the dedup and order keys of each event.
//!
//! This crate knows no store: it turns verified bytes into [`oncegate_core::Event`]s and keys.

mod crypto;
mod envelope;
pub mod events;
mod json;
mod source;
pub mod store_app;

use std::sync::Arc;

pub use crypto::{decrypt, encrypt, legacy_card_signature, signature};
pub use envelope::{Inbound, UNSIGNED_LIMIT, Verified};

/// The request headers Feishu signs with.
pub const HEADER_TIMESTAMP: &str = "x-lark-request-timestamp";
/// The nonce header.
pub const HEADER_NONCE: &str = "x-lark-request-nonce";
/// The signature header.
pub const HEADER_SIGNATURE: &str = "x-lark-signature";

/// Why a callback was refused. Each maps to one HTTP status and says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeishuError {
    /// The signature header does not match the body.
    #[error(
        "signature mismatch: X-Lark-Signature is not SHA-256(timestamp + nonce + encrypt key + body); check the encrypt key"
    )]
    BadSignature,
    /// A header needed for the signature is missing.
    #[error("missing header {0}: an app with an encrypt key must sign every callback")]
    MissingHeader(&'static str),
    /// The verification token in the body is not the configured one.
    #[error("verification token mismatch; check verification_token for this source")]
    BadToken,
    /// The body is encrypted but no encrypt key is configured.
    #[error("the body is encrypted but this source has no encrypt_key configured")]
    NoKey,
    /// The body is not JSON.
    #[error("body is not JSON: {0}")]
    NotJson(String),
    /// The ciphertext does not decrypt.
    #[error("cannot decrypt: {0}")]
    BadCiphertext(String),
    /// The JSON is neither a challenge, a schema 2.0 nor a v1 envelope.
    #[error("unknown envelope: {0}")]
    UnknownEnvelope(String),
    /// A request without a signature that is not a valid URL-verification challenge. One
    /// answer for every such failure, so that unauthenticated callers learn nothing.
    #[error(
        "unsigned request: with an encrypt key configured, only the URL-verification challenge may come without X-Lark-Signature"
    )]
    Unsigned,
    /// The timestamp header is not unix seconds.
    #[error("X-Lark-Request-Timestamp {0:?} is not unix seconds")]
    BadTimestamp(String),
    /// The event names no app.
    #[error("the event has no {0}: every event must name the app it is for")]
    MissingApp(&'static str),
    /// A secret given to the app is empty.
    #[error("the {0} is empty: an empty secret would switch its check off")]
    EmptySecret(&'static str),
    /// The event is for another app.
    #[error("event is for app {got}, but this source is configured for {expected}")]
    WrongApp {
        /// The configured app.
        expected: String,
        /// The event's app.
        got: String,
    },
}

impl FeishuError {
    /// The HTTP status to answer with: 401 for authentication failures, 400 for bad bodies.
    pub fn status(&self) -> u16 {
        match self {
            FeishuError::BadSignature
            | FeishuError::MissingHeader(_)
            | FeishuError::BadToken
            | FeishuError::Unsigned => 401,
            _ => 400,
        }
    }

    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            FeishuError::BadSignature => "bad_signature",
            FeishuError::MissingHeader(_) => "missing_header",
            FeishuError::BadToken => "bad_token",
            FeishuError::NoKey => "no_key",
            FeishuError::NotJson(_) => "not_json",
            FeishuError::BadCiphertext(_) => "bad_ciphertext",
            FeishuError::UnknownEnvelope(_) => "unknown_envelope",
            FeishuError::WrongApp { .. } => "wrong_app",
            FeishuError::Unsigned => "unsigned",
            FeishuError::BadTimestamp(_) => "bad_timestamp",
            FeishuError::MissingApp(_) => "missing_app",
            FeishuError::EmptySecret(_) => "empty_secret",
        }
    }
}

/// The signature headers of one request, as received.
#[derive(Debug, Clone, Copy, Default)]
pub struct SignedHeaders<'a> {
    /// `X-Lark-Request-Timestamp`.
    pub timestamp: Option<&'a str>,
    /// `X-Lark-Request-Nonce`.
    pub nonce: Option<&'a str>,
    /// `X-Lark-Signature`.
    pub signature: Option<&'a str>,
}

impl<'a> SignedHeaders<'a> {
    /// The replay stamp (timestamp in unix seconds, nonce), when both headers came; a
    /// timestamp that is not unix seconds is an error that says so.
    pub fn stamp(&self) -> Result<Option<(u64, &'a str)>, FeishuError> {
        let (Some(timestamp), Some(nonce)) = (self.timestamp, self.nonce) else {
            return Ok(None);
        };
        match timestamp.trim().parse::<u64>() {
            Ok(seconds) => Ok(Some((seconds, nonce))),
            Err(_) => Err(FeishuError::BadTimestamp(
                timestamp.chars().take(40).collect(),
            )),
        }
    }
}

/// Which cloud an app lives on: Feishu (China) and Lark (international) speak the same
/// protocol, but an app, its ids and its events belong to one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    /// Feishu, `open.feishu.cn`.
    Feishu,
    /// Lark, `open.larksuite.com`.
    Lark,
}

impl Cloud {
    /// The source name events carry: `feishu` or `lark`.
    fn platform_name(self) -> &'static str {
        match self {
            Cloud::Feishu => "feishu",
            Cloud::Lark => "lark",
        }
    }
}

/// One configured Feishu or Lark app. Its `Debug` names the app, never its secrets.
#[derive(Clone)]
pub struct FeishuApp {
    platform: Arc<str>,
    app_id: Arc<str>,
    key: Option<EncryptKey>,
    verification_token: Option<String>,
    /// A store app's tenants (商店应用): kept from its lifecycle events; `None` for an app of
    /// one tenant.
    pub(crate) tenants: Option<Arc<oncegate_core::Tenants>>,
}

/// The encrypt key as configured (it signs) and the AES key derived from it (it decrypts).
#[derive(Clone)]
pub(crate) struct EncryptKey {
    pub(crate) text: String,
    pub(crate) aes: [u8; 32],
}

impl std::fmt::Debug for FeishuApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuApp")
            .field("platform", &self.platform)
            .field("app_id", &self.app_id)
            .field("encrypted", &self.key.is_some())
            .field("token", &self.verification_token.is_some())
            .field("store_app", &self.tenants.is_some())
            .finish()
    }
}

impl FeishuApp {
    /// An app on `cloud`. An empty secret is refused: leave it out (`None`) to go without it.
    pub fn new(
        cloud: Cloud,
        app_id: &str,
        encrypt_key: Option<String>,
        verification_token: Option<String>,
    ) -> Result<Self, FeishuError> {
        let blank = |value: &Option<String>| value.as_ref().is_some_and(|v| v.trim().is_empty());
        if blank(&encrypt_key) {
            return Err(FeishuError::EmptySecret("encrypt key"));
        }
        if blank(&verification_token) {
            return Err(FeishuError::EmptySecret("verification token"));
        }
        Ok(Self {
            platform: Arc::from(cloud.platform_name()),
            app_id: Arc::from(app_id),
            key: encrypt_key.map(|text| EncryptKey {
                aes: crypto::aes_key(&text),
                text,
            }),
            verification_token,
            tenants: None,
        })
    }

    /// The same app as a store app (商店应用), installed by many tenants: its `app_ticket`,
    /// `app_open`, `app_status_change` and `app_uninstalled` events keep its tenants
    /// ([`store_app`]). Its events are taken from every tenant — one encrypt key serves them
    /// all, and a tenant that installed before the gateway ran sent no `app_open` it saw.
    pub fn store_app(mut self) -> Self {
        self.tenants = Some(Arc::default());
        self
    }

    /// The platform, `feishu` or `lark`.
    pub fn platform(&self) -> &Arc<str> {
        &self.platform
    }

    /// The app id.
    pub fn app_id(&self) -> &Arc<str> {
        &self.app_id
    }

    /// Verifies and decodes one callback body.
    pub fn open(&self, headers: SignedHeaders<'_>, body: &[u8]) -> Result<Inbound, FeishuError> {
        envelope::open(self, headers, body)
    }

    /// Decodes one document pushed over the long connection, which the app's credentials
    /// authenticated: no signature or verification token is asked of it.
    pub fn open_pushed(&self, body: &[u8]) -> Result<Inbound, FeishuError> {
        envelope::open_pushed(self, body)
    }

    /// Signs and encrypts `plaintext` as Feishu would send it (for `simulate` and tests):
    /// the body and its signature headers for `timestamp` and `nonce`.
    pub fn seal(
        &self,
        plaintext: &[u8],
        timestamp: &str,
        nonce: &str,
        iv: [u8; 16],
    ) -> (Vec<u8>, Option<String>) {
        let body = match &self.key {
            Some(key) => {
                let sealed = crypto::encrypt_with(&key.aes, plaintext, iv);
                serde_json::json!({ "encrypt": sealed })
                    .to_string()
                    .into_bytes()
            }
            None => plaintext.to_vec(),
        };
        let sig = self
            .key
            .as_ref()
            .map(|key| signature(timestamp, nonce, &key.text, &body));
        (body, sig)
    }
}
