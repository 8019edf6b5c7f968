//! The stored forms, encoded with postcard.
//!
//! Records carry a format tag: the first byte of a postcard `RecordState` is its variant index
//! (0, 1 or 2), so a tag above those tells every later format from the first one, which had no
//! tag and no fingerprint. Files written by earlier versions are read as they are; every record
//! written from now on has the current form.

use oncegate_core::{Event, Fingerprint, KeyHash, Record, RecordState, StoreError};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// A queue entry as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Queued {
    pub(crate) key: KeyHash,
    pub(crate) order_hash: u64,
    pub(crate) attempt: u32,
    pub(crate) not_before_ms: u64,
    pub(crate) event: Event,
}

/// Encodes a stored value.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    postcard::to_stdvec(value)
        .map_err(|error| StoreError::Corrupt(format!("cannot encode: {error}")))
}

/// Decodes a stored value.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|error| {
        StoreError::Corrupt(format!(
            "a stored value does not decode ({error}); the file was written by another version"
        ))
    })
}

/// The tag of the current record form: state, expiry, fingerprint.
const RECORD_V2: u8 = 0xF2;

/// The first record form, written before fingerprints: no tag.
#[derive(Deserialize)]
struct RecordV1 {
    state: RecordState,
    expires_at_ms: u64,
}

/// The current record form, read behind its tag.
#[derive(Deserialize)]
struct RecordV2 {
    state: RecordState,
    expires_at_ms: u64,
    fingerprint: Option<Fingerprint>,
}

/// The current record form as written: borrowed, so that writing copies nothing first.
#[derive(Serialize)]
struct RecordV2Ref<'a> {
    state: &'a RecordState,
    expires_at_ms: u64,
    fingerprint: Option<Fingerprint>,
}

/// Encodes a record in the current form: the tag, then the fields, in one buffer.
pub(crate) fn encode_record(record: &Record) -> Result<Vec<u8>, StoreError> {
    let stored = RecordV2Ref {
        state: &record.state,
        expires_at_ms: record.expires_at_ms,
        fingerprint: record.fingerprint,
    };
    postcard::to_extend(&stored, vec![RECORD_V2])
        .map_err(|error| StoreError::Corrupt(format!("cannot encode: {error}")))
}

/// Decodes a record in any form this or an earlier version wrote.
pub(crate) fn decode_record(bytes: &[u8]) -> Result<Record, StoreError> {
    match bytes.split_first() {
        Some((&RECORD_V2, rest)) => {
            let stored: RecordV2 = decode(rest)?;
            Ok(Record {
                state: stored.state,
                expires_at_ms: stored.expires_at_ms,
                fingerprint: stored.fingerprint,
            })
        }
        _ => {
            let stored: RecordV1 = decode(bytes)?;
            Ok(Record {
                state: stored.state,
                expires_at_ms: stored.expires_at_ms,
                fingerprint: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use oncegate_core::FencingToken;

    /// The first form, as a version before fingerprints wrote it.
    #[derive(Serialize)]
    struct WrittenBefore {
        state: RecordState,
        expires_at_ms: u64,
    }

    fn states() -> Vec<RecordState> {
        vec![
            RecordState::Pending,
            RecordState::Processing {
                token: FencingToken(1 << 33 | 7),
                lease_until_ms: 1_700_000_000_123,
            },
            RecordState::Completed { outcome: None },
            RecordState::Completed {
                outcome: Some(Bytes::from_static(b"{\"message_id\":\"om_1\"}")),
            },
        ]
    }

    #[test]
    fn records_of_the_first_form_read_without_a_fingerprint() {
        for state in states() {
            let old = postcard::to_stdvec(&WrittenBefore {
                state: state.clone(),
                expires_at_ms: 1_700_000_060_000,
            })
            .expect("encodes");
            assert!(
                old[0] < RECORD_V2,
                "the first form starts with a variant index"
            );
            let record = decode_record(&old).expect("an old record decodes");
            assert_eq!(
                record,
                Record {
                    state,
                    expires_at_ms: 1_700_000_060_000,
                    fingerprint: None
                }
            );
        }
    }

    #[test]
    fn records_round_trip_in_the_current_form() {
        for state in states() {
            for fingerprint in [None, Some(Fingerprint::of(b"payload"))] {
                let record = Record {
                    state: state.clone(),
                    expires_at_ms: 42,
                    fingerprint,
                };
                let bytes = encode_record(&record).expect("encodes");
                assert_eq!(bytes[0], RECORD_V2);
                assert_eq!(decode_record(&bytes).expect("decodes"), record);
            }
        }
    }

    #[test]
    fn the_current_form_is_pinned() {
        // A change here changes the file format: give it a new tag and keep reading this one.
        let record = Record {
            state: RecordState::Completed {
                outcome: Some(Bytes::from_static(b"ok")),
            },
            expires_at_ms: 300,
            fingerprint: Some(Fingerprint([0xAB; 16])),
        };
        let mut expected = vec![0xF2, 2, 1, 2, b'o', b'k', 0xAC, 0x02, 1];
        expected.extend([0xAB; 16]);
        assert_eq!(encode_record(&record).expect("encodes"), expected);
    }

    #[test]
    fn garbage_is_corrupt_not_a_panic() {
        for bytes in [
            &[][..],
            &[RECORD_V2][..],
            &[9, 9, 9][..],
            &[RECORD_V2, 0xFF, 0xFF][..],
        ] {
            assert!(matches!(decode_record(bytes), Err(StoreError::Corrupt(_))));
        }
    }
}
