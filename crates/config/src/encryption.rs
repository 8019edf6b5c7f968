//! `[store.encryption]`: payloads, results and credentials encrypted at rest (AES-256-GCM),
//! under keys with ids so that they rotate.

use serde::{Deserialize, Serialize};

use crate::Secret;
use crate::checks::Severity;

/// `[store.encryption]`: the keys, newest first. The first encrypts every value written from
/// now on; every key listed reads what was written under it, so a rotated key stays listed
/// until what it wrote has expired.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EncryptionSettings {
    /// The keys, newest (the one that encrypts) first.
    pub keys: Vec<EncryptionKey>,
}

/// One key: its id (kept beside every value it encrypts) and its 32 bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EncryptionKey {
    /// 1 to 32 characters of letters, digits, `-`, `_`, `.`: written beside every value.
    pub id: String,
    /// 32 random bytes as 64 hex digits or 44 characters of base64 (`openssl rand -base64 32`),
    /// from a file or the environment.
    pub key: Option<Secret>,
}

/// The most characters of a key id.
pub const MAX_KEY_ID: usize = 32;

impl EncryptionKey {
    /// The key's 32 bytes, or what is wrong with it (naming the key).
    pub fn bytes(&self) -> Result<[u8; 32], String> {
        let id = &self.id;
        let text = self
            .key
            .as_ref()
            .ok_or_else(|| format!("encryption key {id:?} has no key: set key = {{ file = … }}"))?
            .resolve()
            .map_err(|why| format!("encryption key {id:?}: {why}"))?;
        let text = text.trim();
        let decoded = if text.len() == 64 && text.chars().all(|c| c.is_ascii_hexdigit()) {
            (0..32)
                .map(|i| u8::from_str_radix(&text[i * 2..i * 2 + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .ok()
        } else {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(text).ok()
        };
        decoded
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .ok_or_else(|| {
                format!(
                    "encryption key {id:?} is not 32 bytes as 64 hex digits or base64 (make one \
                     with: openssl rand -base64 32)"
                )
            })
    }
}

/// The keys' problems: ids, doubles, keys that do not resolve to 32 bytes.
pub(crate) fn check(
    settings: &EncryptionSettings,
    at: &str,
    report: &mut impl FnMut(Severity, &str, String),
) {
    if settings.keys.is_empty() {
        report(
            Severity::Error,
            &format!("{at}.keys"),
            "encryption needs at least one key ([[store.encryption.keys]] with id and key)".into(),
        );
    }
    for (i, key) in settings.keys.iter().enumerate() {
        let here = format!("{at}.keys[{i}]");
        let id_ok = !key.id.is_empty()
            && key.id.len() <= MAX_KEY_ID
            && key
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !id_ok {
            report(
                Severity::Error,
                &format!("{here}.id"),
                format!(
                    "{:?}: a key id is 1 to {MAX_KEY_ID} letters, digits, '-', '_' or '.'",
                    key.id
                ),
            );
        }
        if settings.keys[..i].iter().any(|other| other.id == key.id) {
            report(
                Severity::Error,
                &format!("{here}.id"),
                format!("{:?} is listed twice: each key has its own id", key.id),
            );
        }
        if let Err(why) = key.bytes() {
            report(Severity::Error, &format!("{here}.key"), why);
        }
    }
}
