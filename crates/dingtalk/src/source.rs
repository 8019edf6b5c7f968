//! [`DingtalkApp`]: a DingTalk app's event subscription as a [`WebhookSource`] and a [`Sealer`].

use std::borrow::Cow;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use oncegate_core::{
    Accepted, Admit, Callback, Decoded, Event, Keys, Method, Refusal, RefusalKind, Reply,
    SealedRequest, Sealer, SyntheticMessage, WebhookSource, key_for,
};
use oncegate_wecom::AesKey;
use oncegate_wecom::crypto;
use serde_json::Value;
use sha2::Digest as _;

use crate::DingtalkError;

/// The URL checks: answered with the encrypted `success`, never admitted.
const CHECKS: &[&str] = &[
    "check_url",
    "check_create_suite_url",
    "check_update_suite_url",
];

/// One DingTalk app's event subscription.
pub struct DingtalkApp {
    token: String,
    key: AesKey,
    owner: Arc<str>,
    /// Where the answers' random prefixes and nonces come from.
    random: RandomState,
    answers: AtomicU64,
}

impl std::fmt::Debug for DingtalkApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DingtalkApp")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl DingtalkApp {
    /// The app whose callbacks carry `token` and are encrypted with `aes_key` (43 characters)
    /// for `owner`: the app's AppKey for an app's own subscription, the corp id for the older
    /// `register_call_back`, the SuiteKey for a third-party suite.
    pub fn new(token: &str, aes_key: &str, owner: &str) -> Result<Self, DingtalkError> {
        for (name, value) in [("token", token), ("aes_key", aes_key), ("owner key", owner)] {
            if value.trim().is_empty() {
                return Err(DingtalkError::Empty(name));
            }
        }
        let key = AesKey::from_encoding_aes_key(aes_key)
            .map_err(|error| DingtalkError::Key(error.to_string()))?;
        Ok(Self {
            token: token.to_owned(),
            key,
            owner: Arc::from(owner),
            random: RandomState::new(),
            answers: AtomicU64::new(0),
        })
    }

    /// 8 bytes no other answer of this process had.
    fn fresh(&self) -> u64 {
        self.random
            .hash_one(self.answers.fetch_add(1, Ordering::Relaxed))
    }

    /// The encrypted answer DingTalk requires (`getEncryptedMap("success")`): the word
    /// encrypted for the owner, signed with a fresh timestamp and nonce.
    fn encrypted_success(&self) -> Reply {
        let mut random = [0u8; 16];
        random[..8].copy_from_slice(&self.fresh().to_be_bytes());
        random[8..].copy_from_slice(&self.fresh().to_be_bytes());
        let encrypt = crypto::encrypt(&self.key, b"success", &self.owner, random);
        let nonce: String = format!("{:016x}", self.fresh())[..8].to_owned();
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
            .to_string();
        let signature = crypto::signature(&[&self.token, &timestamp, &nonce, &encrypt]);
        Reply::json(Bytes::from(
            serde_json::json!({
                "msg_signature": signature,
                "timeStamp": timestamp,
                "nonce": nonce,
                "encrypt": encrypt,
            })
            .to_string(),
        ))
    }

    /// The event the plaintext is: its id (`eventId`, else a digest of the whole plaintext,
    /// which older events without one repeat byte for byte), type, time, corp and chat.
    fn event(&self, plaintext: &[u8], document: &Value) -> Event {
        let text = |names: &[&str]| field(document, names);
        let event_id = text(&["eventId", "EventId"]).unwrap_or_else(|| {
            Arc::from(oncegate_core::fingerprint_id(
                &sha2::Sha256::digest(plaintext).into(),
            ))
        });
        let created_at_ms = text(&["EventTime", "eventTime", "TimeStamp"])
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or_else(arrival_ms);
        Event {
            platform: Arc::from("dingtalk"),
            app: self.owner.clone(),
            tenant: text(&["CorpId", "corpId"]),
            event_id,
            event_type: text(&["EventType", "eventType"]).unwrap_or_else(|| Arc::from("unknown")),
            created_at_ms,
            order_key: text(CHAT_FIELDS),
            payload: Bytes::copy_from_slice(plaintext),
        }
    }
}

/// The first of `names` `document` has as a non-empty string or a number, as text.
pub(crate) fn field(document: &Value, names: &[&str]) -> Option<Arc<str>> {
    names.iter().find_map(|name| match document.get(*name) {
        Some(Value::String(s)) if !s.is_empty() => Some(Arc::from(s.as_str())),
        Some(Value::Number(n)) => Some(Arc::from(n.to_string())),
        _ => None,
    })
}

/// Now, for an event without DingTalk's time: the time it arrived (0 would read as 1970, older
/// than any event a watermark route applied).
pub(crate) fn arrival_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The chat an event of DingTalk's is about, by its spellings.
pub(crate) const CHAT_FIELDS: &[&str] = &[
    "chatId",
    "ChatId",
    "openConversationId",
    "OpenConversationId",
    "conversationId",
];

/// A query parameter, percent-decoded, by any of its spellings.
fn param<'a>(query: Option<&'a str>, names: &[&str]) -> Option<Cow<'a, str>> {
    query?.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        names
            .contains(&name)
            .then(|| percent_encoding::percent_decode_str(value).decode_utf8_lossy())
            .filter(|value| !value.is_empty())
    })
}

fn unauthenticated(label: &'static str, message: &str) -> Refusal {
    Refusal::new(RefusalKind::Unauthenticated, label, message)
}

fn bad(label: &'static str, message: String) -> Refusal {
    Refusal::new(RefusalKind::BadInput, label, message)
}

impl WebhookSource for DingtalkApp {
    fn platform(&self) -> &str {
        "dingtalk"
    }

    fn decode(&self, callback: &Callback<'_>) -> Result<Decoded, Refusal> {
        if callback.method != Method::Post {
            return Err(Refusal::new(
                RefusalKind::Method,
                "method",
                "DingTalk posts its callbacks: use POST",
            ));
        }
        let missing = "DingTalk signs every callback: msg_signature (or signature), timeStamp \
                       (or timestamp) and nonce in the query";
        let (Some(signature), Some(timestamp), Some(nonce)) = (
            param(callback.query, &["msg_signature", "signature"]),
            param(callback.query, &["timeStamp", "timestamp"]),
            param(callback.query, &["nonce"]),
        ) else {
            return Err(unauthenticated("missing_signature", missing));
        };
        let body: Value = serde_json::from_slice(callback.body).map_err(|_| {
            unauthenticated(
                "bad_signature",
                "the body is not DingTalk's {\"encrypt\": …}",
            )
        })?;
        let Some(encrypt) = body.get("encrypt").and_then(Value::as_str) else {
            return Err(unauthenticated("bad_signature", "the body has no encrypt"));
        };
        if !crypto::verify(&signature, &[&self.token, &timestamp, &nonce, encrypt]) {
            return Err(unauthenticated(
                "bad_signature",
                "the signature does not match: another token, or a changed request",
            ));
        }
        let plaintext = crypto::decrypt(&self.key, encrypt, &self.owner)
            .map_err(|error| bad("undecryptable", error.to_string()))?;
        let document: Value = serde_json::from_slice(&plaintext)
            .map_err(|_| bad("not_json", "the decrypted event is not JSON".into()))?;
        let event_type = document.get("EventType").and_then(Value::as_str);
        if event_type.is_some_and(|t| CHECKS.contains(&t)) {
            return Ok(Decoded::Challenge(self.encrypted_success()));
        }
        let event = self.event(&plaintext, &document);
        let keys = Keys::new(key_for(
            "dingtalk",
            &self.owner,
            "event_id",
            &event.event_id,
        ));
        Ok(Decoded::Admit {
            admit: Admit::new(event, keys),
            // No window is documented and the timestamp's unit differs between DingTalk's own
            // examples (ms and s): a copy is caught by its event id, answered as a duplicate.
            stamp: None,
        })
    }

    fn accepted(&self, _: Accepted) -> Reply {
        self.encrypted_success()
    }
}

impl Sealer for DingtalkApp {
    fn message(&self, message: &SyntheticMessage) -> Vec<u8> {
        serde_json::json!({
            "EventType": "chat_update_title",
            "eventId": message.id,
            "EventTime": message.created_ms,
            "CorpId": "ding_corp",
            "chatId": message.chat,
            "Operator": message.sender,
            "Title": message.text,
        })
        .to_string()
        .into_bytes()
    }

    fn seal(
        &self,
        plaintext: &[u8],
        timestamp_secs: u64,
        nonce: &str,
        iv: [u8; 16],
    ) -> SealedRequest {
        let encrypt = crypto::encrypt(&self.key, plaintext, &self.owner, iv);
        let timestamp = (timestamp_secs * 1000).to_string();
        let signature = crypto::signature(&[&self.token, &timestamp, nonce, &encrypt]);
        let encoded: String =
            percent_encoding::utf8_percent_encode(nonce, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        SealedRequest {
            method: Method::Post,
            query: Some(format!(
                "msg_signature={signature}&timeStamp={timestamp}&nonce={encoded}"
            )),
            headers: vec![("content-type", "application/json".into())],
            body: serde_json::json!({ "encrypt": encrypt })
                .to_string()
                .into_bytes(),
        }
    }
}
