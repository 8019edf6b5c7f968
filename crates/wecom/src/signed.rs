//! The signed query every WeCom and WeChat callback carries: its signature checked over the
//! token, timestamp, nonce (and the ciphertext), and the replay stamp read from it.

use oncegate_core::Stamp;

use crate::query::Query;
use crate::{WecomError, crypto};

/// The signed query parameters every callback carries.
pub(crate) struct Signed<'q> {
    signature: &'q str,
    timestamp: &'q str,
    nonce: &'q str,
}

impl<'q> Signed<'q> {
    pub(crate) fn from(query: &'q Query, signature: &str) -> Result<Self, WecomError> {
        match (
            query.get(signature),
            query.get("timestamp"),
            query.get("nonce"),
        ) {
            (Some(signature), Some(timestamp), Some(nonce)) => Ok(Self {
                signature,
                timestamp,
                nonce,
            }),
            _ => Err(WecomError::BadSignature),
        }
    }

    /// Verifies the signature over the token, the timestamp, the nonce and `extra`.
    pub(crate) fn verify(&self, token: &str, extra: Option<&str>) -> Result<(), WecomError> {
        let mut parts = vec![token, self.timestamp, self.nonce];
        parts.extend(extra);
        if crypto::verify(self.signature, &parts) {
            Ok(())
        } else {
            Err(WecomError::BadSignature)
        }
    }

    /// The replay stamp: only read once the signature verified. These platforms' nonces are
    /// not unique per request, and their retries repeat the request byte for byte: the stamp
    /// names the request by its body's digest too (the plain-mode signature does not cover the
    /// body, so the signature alone would not do).
    /// The replay stamp of plain mode, whose signature covers the timestamp and nonce but not
    /// the body: the signed query is the request, so that a captured query posted with another
    /// body is the replay it is (never admitted), while WeChat's retries — the same query and
    /// body — stay duplicates.
    pub(crate) fn plain_stamp(&self) -> Result<Stamp, WecomError> {
        let mut stamp = self.stamp(b"")?;
        stamp.request = Some(self.signature.to_ascii_lowercase());
        Ok(stamp)
    }

    /// A verified URL verification's answer, with its signed timestamp for the replay window.
    pub(crate) fn challenge(
        &self,
        answer: oncegate_core::Reply,
    ) -> Result<oncegate_core::Decoded, WecomError> {
        Ok(oncegate_core::Decoded::SignedChallenge {
            answer,
            timestamp_secs: self.stamp(b"")?.timestamp_secs,
        })
    }

    pub(crate) fn stamp(&self, body: &[u8]) -> Result<Stamp, WecomError> {
        let timestamp_secs = self
            .timestamp
            .parse()
            .map_err(|_| WecomError::BadTimestamp(self.timestamp.to_owned()))?;
        Ok(Stamp {
            timestamp_secs,
            nonce: self.nonce.to_owned(),
            request: Some(crypto::digest(body)),
        })
    }
}
