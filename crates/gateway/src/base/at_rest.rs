//! Values encrypted at rest (`[store.encryption]`): event payloads, results and credentials
//! sealed with AES-256-GCM before they reach the store (the journal's files, Redis, the spool)
//! and opened when they come back. Each sealed value names the key that sealed it, so keys
//! rotate: the newest seals, every listed key opens. A value without the mark was written
//! before encryption was turned on and is read as it is.

use std::collections::HashMap;

use bytes::Bytes;
use oncegate_config::EncryptionSettings;
use oncegate_core::{Claim, Event, Record, RecordState, StoreError};

use self::cipher::{Key, NONCE_LEN};

/// AES-256-GCM, from ring (already in the build for TLS and `v1a` signatures).
#[cfg(feature = "at-rest")]
mod cipher {
    use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    use ring::rand::{SecureRandom, SystemRandom};

    pub(super) use ring::aead::NONCE_LEN;

    /// One key.
    pub(super) struct Key(LessSafeKey);

    pub(super) fn key(bytes: &[u8; 32]) -> Result<Key, String> {
        UnboundKey::new(&AES_256_GCM, bytes)
            .map(|key| Key(LessSafeKey::new(key)))
            .map_err(|_| "AES-256-GCM refused the key".to_owned())
    }

    /// A fresh random nonce.
    pub(super) fn nonce() -> Option<[u8; NONCE_LEN]> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        Some(nonce)
    }

    /// Seals `in_out` in place, its tag appended.
    pub(super) fn seal(
        key: &Key,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        in_out: &mut Vec<u8>,
    ) -> bool {
        key.0
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
            .is_ok()
    }

    /// Opens `in_out` in place: the plaintext's length, or `None` when it does not open.
    pub(super) fn open(key: &Key, nonce: &[u8], aad: &[u8], in_out: &mut [u8]) -> Option<usize> {
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        key.0
            .open_in_place(nonce, Aad::from(aad), in_out)
            .ok()
            .map(|plain| plain.len())
    }
}

/// A build without the `at-rest` feature: no key can be made, so nothing is ever sealed.
#[cfg(not(feature = "at-rest"))]
mod cipher {
    pub(super) const NONCE_LEN: usize = 12;

    pub(super) struct Key;

    pub(super) fn key(_: &[u8; 32]) -> Result<Key, String> {
        Err(
            "this build leaves out encryption at rest: build oncegate-gateway with its `at-rest` \
             feature (the oncegate binary has it)"
                .to_owned(),
        )
    }

    pub(super) fn nonce() -> Option<[u8; NONCE_LEN]> {
        None
    }

    pub(super) fn seal(_: &Key, _: [u8; NONCE_LEN], _: &[u8], _: &mut Vec<u8>) -> bool {
        false
    }

    pub(super) fn open(_: &Key, _: &[u8], _: &[u8], _: &mut [u8]) -> Option<usize> {
        None
    }
}

/// What every sealed value starts with: no payload of a platform (JSON, XML) or result does.
const MARK: &[u8] = b"\0ogz1";

/// What a value is bound to, so that a sealed value moved to another place does not open.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place<'a> {
    /// An event's payload (queue entries, dead letters, the spool).
    Payload,
    /// A key's stored result (`/keys`, `/send`, sync replies).
    Outcome,
    /// A shared value: its namespace and name.
    State(&'a str, &'a str),
}

impl Place<'_> {
    fn aad(&self) -> Vec<u8> {
        match self {
            Place::Payload => b"payload".to_vec(),
            Place::Outcome => b"outcome".to_vec(),
            Place::State(namespace, name) => format!("state\0{namespace}\0{name}").into_bytes(),
        }
    }
}

/// The keys.
pub(crate) struct AtRest {
    sealing: (String, Key),
    opening: HashMap<String, Key>,
}

impl std::fmt::Debug for AtRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtRest")
            .field("sealing", &self.sealing.0)
            .field("keys", &self.opening.len())
            .finish_non_exhaustive()
    }
}

impl AtRest {
    /// The configured keys (the first seals), or what is wrong with one of them, named.
    pub(crate) fn new(settings: &EncryptionSettings) -> Result<Self, String> {
        let mut opening = HashMap::new();
        let mut sealing = None;
        for configured in &settings.keys {
            let bytes = configured.bytes()?;
            let made = cipher::key(&bytes).map_err(|why| format!("{}: {why}", configured.id))?;
            if sealing.is_none() {
                sealing = Some((configured.id.clone(), cipher::key(&bytes)?));
            }
            opening.insert(configured.id.clone(), made);
        }
        let sealing = sealing.ok_or("store.encryption lists no key")?;
        Ok(Self { sealing, opening })
    }

    /// The id of the key that seals.
    pub(crate) fn sealing_id(&self) -> &str {
        &self.sealing.0
    }

    /// `plain` sealed under the newest key for `place`; a value sealed already stays as it is
    /// (a spooled event is sealed before the spool and admitted later).
    pub(crate) fn seal(&self, plain: &[u8], place: Place<'_>) -> Result<Bytes, StoreError> {
        if plain.starts_with(MARK) {
            return Ok(Bytes::copy_from_slice(plain));
        }
        let failed = |what: &str| StoreError::Unavailable(format!("{what}: nothing was written"));
        let (id, key) = &self.sealing;
        let nonce =
            cipher::nonce().ok_or_else(|| failed("the system's random generator failed"))?;
        let mut sealed =
            Vec::with_capacity(MARK.len() + 1 + id.len() + NONCE_LEN + plain.len() + 16);
        sealed.extend_from_slice(MARK);
        // Ids are at most 32 bytes (checked with the configuration).
        sealed.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
        sealed.extend_from_slice(id.as_bytes());
        sealed.extend_from_slice(&nonce);
        let mut in_out = plain.to_vec();
        if !cipher::seal(key, nonce, &place.aad(), &mut in_out) {
            return Err(failed("AES-256-GCM refused to seal"));
        }
        sealed.extend_from_slice(&in_out);
        Ok(Bytes::from(sealed))
    }

    /// `stored` opened (or as it is when it was never sealed), or why not: a key id not listed,
    /// a value that does not open with its key (a wrong key, or damage).
    pub(crate) fn open(&self, stored: &Bytes, place: Place<'_>) -> Result<Bytes, StoreError> {
        let Some(rest) = stored.strip_prefix(MARK) else {
            return Ok(stored.clone());
        };
        let damaged = || StoreError::Invalid("a sealed value is cut short".into());
        let (&id_len, rest) = rest.split_first().ok_or_else(damaged)?;
        let id_len = usize::from(id_len);
        if rest.len() < id_len + NONCE_LEN + 16 {
            return Err(damaged());
        }
        let (id, rest) = rest.split_at(id_len);
        let id = String::from_utf8_lossy(id);
        let key = self.opening.get(id.as_ref()).ok_or_else(|| {
            StoreError::Invalid(format!(
                "a value was sealed with key {id:?}, which store.encryption does not list: add \
                 it back (after the newest) until what it sealed has expired"
            ))
        })?;
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let mut in_out = sealed.to_vec();
        let len = cipher::open(key, nonce, &place.aad(), &mut in_out).ok_or_else(|| {
            StoreError::Invalid(format!(
                "a value sealed with key {id:?} does not open: the key listed as {id:?} is \
                 not the one that sealed it, or the value is damaged"
            ))
        })?;
        in_out.truncate(len);
        Ok(Bytes::from(in_out))
    }

    /// `event` with its payload sealed.
    pub(crate) fn seal_event(&self, mut event: Event) -> Result<Event, StoreError> {
        event.payload = self.seal(&event.payload, Place::Payload)?;
        Ok(event)
    }

    /// `event`'s payload opened.
    pub(crate) fn open_event(&self, event: &mut Event) -> Result<(), StoreError> {
        event.payload = self.open(&event.payload, Place::Payload)?;
        Ok(())
    }

    /// A result sealed, if there is one.
    pub(crate) fn seal_outcome(&self, outcome: Option<Bytes>) -> Result<Option<Bytes>, StoreError> {
        outcome
            .map(|value| self.seal(&value, Place::Outcome))
            .transpose()
    }

    /// A claim's stored result opened.
    pub(crate) fn open_claim(&self, claim: Claim) -> Result<Claim, StoreError> {
        Ok(match claim {
            Claim::Done { outcome } => Claim::Done {
                outcome: self.open_some(outcome, Place::Outcome)?,
            },
            other => other,
        })
    }

    /// A record's stored result opened.
    pub(crate) fn open_record(&self, mut record: Record) -> Result<Record, StoreError> {
        if let RecordState::Completed { outcome } = record.state {
            record.state = RecordState::Completed {
                outcome: self.open_some(outcome, Place::Outcome)?,
            };
        }
        Ok(record)
    }

    /// `open` for an optional value.
    pub(crate) fn open_some(
        &self,
        stored: Option<Bytes>,
        place: Place<'_>,
    ) -> Result<Option<Bytes>, StoreError> {
        stored.map(|value| self.open(&value, place)).transpose()
    }
}

/// Where each key's check value lives: sealed under that key when it first sealed, opened at
/// every start to prove the key listed under its id is the one that wrote the store's values.
const CHECKS: &str = "at-rest";
const CHECK_TEXT: &[u8] = b"oncegate at-rest key check";

/// Refuses keys that do not match what the store holds: a key listed under an id whose check
/// value does not open names that id. Leaves a check for the sealing key when there is none.
/// `raw` is the store without sealing. A backend that keeps no shared values (the earlier redb
/// file) has nothing to check against.
pub(crate) async fn verify<S: oncegate_core::StateStore>(
    at_rest: &AtRest,
    raw: &S,
) -> Result<(), String> {
    for id in at_rest.opening.keys() {
        let name = format!("check:{id}");
        let kept = match raw.state_get(CHECKS, &name).await {
            Ok(kept) => kept,
            Err(StoreError::Invalid(_)) => return Ok(()),
            Err(error) => return Err(format!("the store cannot answer: {error}")),
        };
        match kept {
            Some(kept) => {
                let opened = at_rest.open(&kept.value, Place::State(CHECKS, &name));
                if !opened.is_ok_and(|text| text == CHECK_TEXT) {
                    return Err(format!(
                        "store.encryption key {id:?} is not the key that sealed this store's                          values under {id:?}: list the right key for that id (nothing was read                          or written)"
                    ));
                }
            }
            None if id == at_rest.sealing_id() => {
                let sealed = at_rest
                    .seal(CHECK_TEXT, Place::State(CHECKS, &name))
                    .map_err(|error| error.to_string())?;
                raw.state_put(CHECKS, &name, sealed, oncegate_core::Expect::Absent, None)
                    .await
                    .map_err(|error| format!("the store cannot answer: {error}"))?;
            }
            None => {}
        }
    }
    Ok(())
}

#[cfg(all(test, feature = "at-rest"))]
mod tests {
    use super::*;
    use oncegate_config::{EncryptionKey, Secret};

    fn settings(keys: &[(&str, &str)]) -> EncryptionSettings {
        EncryptionSettings {
            keys: keys
                .iter()
                .map(|(id, key)| EncryptionKey {
                    id: (*id).into(),
                    key: Some(Secret::Inline((*key).into())),
                })
                .collect(),
        }
    }

    const K1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    const K2: &str = "6162636465666768696a6b6c6d6e6f707172737475767778797a303132333435";

    #[test]
    fn sealed_values_open_under_their_key_and_place_only() {
        let old = AtRest::new(&settings(&[("k1", K1)])).expect("keys");
        let seal =
            |at_rest: &AtRest, plain: &[u8]| at_rest.seal(plain, Place::Payload).expect("seal");
        let sealed = seal(&old, b"{\"text\":\"secret\"}");
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_ne!(sealed, seal(&old, b"{\"text\":\"secret\"}"));
        assert_eq!(
            &old.open(&sealed, Place::Payload).expect("open")[..],
            b"{\"text\":\"secret\"}"
        );
        // Sealing what is sealed changes nothing; a value never sealed reads as it is.
        assert_eq!(seal(&old, &sealed), sealed);
        let plain = Bytes::from_static(b"written before");
        assert_eq!(old.open(&plain, Place::Payload).expect("plain"), plain);
        // Moved to another place, it does not open.
        assert!(old.open(&sealed, Place::Outcome).is_err());
        // Rotated: the new key seals, the old one still opens what it sealed.
        let rotated = AtRest::new(&settings(&[("k2", K2), ("k1", K1)])).expect("keys");
        assert_eq!(rotated.sealing_id(), "k2");
        assert!(rotated.open(&sealed, Place::Payload).is_ok());
        let new = seal(&rotated, b"x");
        let error = old.open(&new, Place::Payload).expect_err("k2 unknown");
        assert!(error.to_string().contains("\"k2\""), "{error}");
        // The same id with other bytes: refused, named.
        let wrong = AtRest::new(&settings(&[("k1", K2)])).expect("keys");
        let error = wrong.open(&sealed, Place::Payload).expect_err("wrong key");
        assert!(error.to_string().contains("does not open"), "{error}");
        // Cut short: refused, no panic.
        for end in 0..sealed.len() {
            let _ = old.open(&sealed.slice(..end), Place::Payload);
        }
    }
}
