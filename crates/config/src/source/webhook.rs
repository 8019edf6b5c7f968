//! `platform = "webhook"`: any platform's webhooks by configuration — a preset's rules
//! (`preset = "slack"`) or each setting written out, the preset's changed by any set here.

use serde::{Deserialize, Serialize};

use super::Secret;

/// A generic webhook source. Every setting left out is the preset's; without a preset, `id`
/// and a way to verify (`verify`) are needed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// A platform's rules: `slack`, `github`, `standard-webhooks`, `telegram`, `discord`,
    /// `wkteam` or `xingyapi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// The app's id on its platform, which scopes its events' keys (a Telegram bot's id: its
    /// `update_id`s repeat across bots); the source's name unless set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_id: Option<String>,
    /// The platform's name in events, keys and metrics; the preset's, or `webhook`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_name: Option<String>,
    /// How requests are verified: `hmac-sha256`, `hmac-sha1`, `hmac-sha512` (a signature),
    /// `ed25519` (the secret is the public key, hex), `token` (a shared token equal to the secret), or `none` — only written out, and said
    /// at risk: anyone who knows the URL can send events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyKind>,
    /// The secret (the signing secret, the token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// Secrets that still verify during a rotation.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub previous_secrets: Vec<Secret>,
    /// Where the signature (or, `verify = "token"`, the token) is: `header:X-Signature`,
    /// `query:token` or a JSON pointer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// What the signature covers: text with `{body}`, `{timestamp}`, `{id}`, `{secret}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed: Option<String>,
    /// How the signature is written: `hex` or `base64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<SignatureEncoding>,
    /// What precedes the signature (`sha256=`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// What separates several signatures in one value (a rotation's), one character.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub separator: Option<String>,
    /// How the secret becomes the key: `text` (its bytes) or `base64` (after `whsec_`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyEncoding>,
    /// Where the signed timestamp is; checked against `[replay] max_skew`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    /// The timestamp's unit: `s` or `ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp_unit: Option<TimeUnit>,
    /// The event id: each part required, joined by `:` (`["header:X-Hook", "/id"]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Vec<String>>,
    /// Without an id, the fields whose digest keys the event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<Vec<String>>,
    /// The event's type: the parts present, joined by `.`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub event_type: Option<Vec<String>>,
    /// The chat whose events run in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// The tenant inside the app.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// When the platform created the event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Its unit: `s` or `ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at_unit: Option<TimeUnit>,
    /// Requests answered at once and never admitted (a URL check), tried in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handshake: Option<Vec<HandshakeSettings>>,
    /// The body of the answer to an event (empty unless set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Its type: `text` or `json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_type: Option<AnswerType>,
    /// What `/send/<source>` sends through: the platform's message API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send: Option<HttpSendSettings>,
}

/// `verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyKind {
    /// HMAC-SHA1.
    HmacSha1,
    /// HMAC-SHA256.
    HmacSha256,
    /// HMAC-SHA512.
    HmacSha512,
    /// An Ed25519 signature; the secret is the app's public key (hex).
    Ed25519,
    /// A shared token.
    Token,
    /// Nothing (at risk).
    None,
}

/// `encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignatureEncoding {
    /// Hexadecimal.
    Hex,
    /// Base64.
    Base64,
}

/// `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyEncoding {
    /// The secret's bytes.
    Text,
    /// Base64 after `whsec_`.
    Base64,
}

/// A time's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeUnit {
    /// Seconds.
    #[serde(rename = "s")]
    Seconds,
    /// Milliseconds.
    #[serde(rename = "ms")]
    Milliseconds,
}

/// `answer_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerType {
    /// Plain text.
    Text,
    /// JSON.
    Json,
}

/// `[[source.handshake]]`: when the value at `when` equals `equals`, answer with the value at
/// `echo`, or with `answer`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HandshakeSettings {
    /// Where the value that tells it is.
    pub when: String,
    /// What it equals.
    pub equals: String,
    /// Where the value to answer with is (as text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub echo: Option<String>,
    /// A fixed answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The fixed answer's type: `text` or `json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_type: Option<AnswerType>,
}

/// `[source.send]`: the platform's message API that `/send/<source>` sends through — a JSON
/// `POST` with fixed headers, the platform's idempotency key written where the API reads it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSendSettings {
    /// Where the caller's body is posted.
    pub url: String,
    /// Headers of every call (an `Authorization`), each a secret.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, Secret>,
    /// JSON pointers the platform's idempotency key is written at (`/client_msg_id`; Discord's
    /// `/nonce`); none: the API takes no key, and an unknown outcome is never sent again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<String>,
    /// The longest key the API takes (Discord: 25); 32 unless set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_max: Option<usize>,
    /// Fields every call carries, by JSON pointer (`{ "/enforce_nonce" = true }`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub set: std::collections::BTreeMap<String, toml::Value>,
    /// Whether the API drops a second call with a key it has seen; true when `key` is set,
    /// unless said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedups: Option<bool>,
    /// Where the API's own result code is in its answer (`/errcode`); unset: any 2xx is sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ok: Option<String>,
    /// The codes at `ok` that mean sent (`[0]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ok_values: Vec<toml::Value>,
    /// The codes at `ok` that mean "over a limit, nothing sent: retry later".
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retry_values: Vec<toml::Value>,
    /// Where the receiver is in the caller's body (`/channel_id`): its sends share a budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receiver: Option<String>,
    /// One receiver's sends per minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_receiver_per_minute: Option<u32>,
    /// Every send's calls per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_second: Option<u32>,
}

impl WebhookSettings {
    /// Its secrets with their settings' names.
    pub fn secrets(&self) -> impl Iterator<Item = (&'static str, &Secret)> {
        self.secret
            .iter()
            .map(|s| ("secret", s))
            .chain(
                self.previous_secrets
                    .iter()
                    .map(|s| ("previous_secrets", s)),
            )
            .chain(
                self.send
                    .iter()
                    .flat_map(|send| send.headers.values())
                    .map(|s| ("send.headers", s)),
            )
    }
}
