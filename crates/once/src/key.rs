//! What to claim: a key in its partition, for how long, for which payload.

use std::time::Duration;

use oncegate_core::{Fingerprint, KeyHash};

/// One key to claim. The lease and its renewal period default to the [`Once`](crate::Once)'s.
#[derive(Debug, Clone, Copy)]
pub struct OnceKey {
    pub(crate) key: KeyHash,
    pub(crate) partition: u16,
    pub(crate) lease: Option<Duration>,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) fingerprint: Option<Fingerprint>,
}

impl OnceKey {
    /// `key`'s record in `partition`. Two callers share a record only when they name the same
    /// key in the same partition: a business key's is `key.home(partitions)`, an event's the
    /// partition of its queue (see `DedupStore`).
    pub fn new(key: KeyHash, partition: u16) -> Self {
        Self {
            key,
            partition,
            lease: None,
            renew_every: None,
            fingerprint: None,
        }
    }

    /// Holds the key for `lease` at a time (renewed while work runs under it).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Renews the lease this often while work runs (default: a third of the lease).
    #[must_use]
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// The claim is for this payload: a later claim of the key for another payload is a
    /// [`Conflict`](crate::Claimed::Conflict), not a repeat.
    #[must_use]
    pub fn payload(self, payload: &[u8]) -> Self {
        self.fingerprint(Fingerprint::of(payload))
    }

    /// [`payload`](Self::payload), with a fingerprint computed before.
    #[must_use]
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// The key.
    pub fn key(&self) -> KeyHash {
        self.key
    }

    /// The partition of its record.
    pub fn partition(&self) -> u16 {
        self.partition
    }
}
