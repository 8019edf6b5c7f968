//! The stored forms, encoded with postcard.

use oncegate_core::{Event, KeyHash, StoreError};
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
