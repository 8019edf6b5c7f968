//! The records of the state machine and the answers the store gives.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::key::KeyHash;

/// A fencing token: grows with every lease grant and never repeats for one store, across
/// restarts (the high bits are a run number the store bumps on every open).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// Bits of the token given to the per-run counter.
    pub const COUNTER_BITS: u32 = 32;

    /// The token for grant number `counter` in run `run`.
    pub fn compose(run: u64, counter: u64) -> Self {
        Self((run << Self::COUNTER_BITS) | (counter & ((1 << Self::COUNTER_BITS) - 1)))
    }

    /// The run this token was granted in.
    pub fn run(self) -> u64 {
        self.0 >> Self::COUNTER_BITS
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a key stands in `Pending → Processing → Completed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordState {
    /// Admitted (seen) and waiting for a worker, or released by one.
    Pending,
    /// Claimed by the holder of `token` until `lease_until_ms`.
    Processing {
        /// The holder's fencing token.
        token: FencingToken,
        /// When the lease runs out and another worker may claim.
        lease_until_ms: u64,
    },
    /// Done; `outcome` is what the handler stored for repeats to read.
    Completed {
        /// The stored result, if the handler gave one.
        outcome: Option<Bytes>,
    },
}

/// A digest of the payload a key was first claimed for: a repeat under the same key with a
/// different payload is a conflict, not a repeat. SHA-256 truncated to 128 bits, so that no
/// caller can make two payloads look alike.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    /// The fingerprint of `payload`.
    pub fn of(payload: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(payload);
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        Self(bytes)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

/// One key's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The state.
    pub state: RecordState,
    /// When the record's retention ends (a live lease keeps it beyond that).
    pub expires_at_ms: u64,
    /// The payload the key was claimed for, when the claimer named one.
    pub fingerprint: Option<Fingerprint>,
}

impl Record {
    /// Whether the record still counts at `now_ms`: within retention, or under a live lease.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
            || matches!(self.state, RecordState::Processing { lease_until_ms, .. } if now_ms < lease_until_ms)
    }

    /// The time after which the record can be forgotten.
    pub fn forget_after_ms(&self) -> u64 {
        match self.state {
            RecordState::Processing { lease_until_ms, .. } => {
                self.expires_at_ms.max(lease_until_ms)
            }
            _ => self.expires_at_ms,
        }
    }
}

/// A granted lease: present it to renew, complete or release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The key the lease is on.
    pub key: KeyHash,
    /// The partition the key's record lives in.
    pub partition: u16,
    /// The fencing token of this grant.
    pub token: FencingToken,
    /// When the lease runs out unless renewed.
    pub until_ms: u64,
}

impl Lease {
    /// The identity of the record the lease is on (`KeyHash::in_partition`), for backends that
    /// keep every partition's records in one table.
    pub fn record_id(&self) -> KeyHash {
        self.key.in_partition(self.partition)
    }
}

/// The answer to `claim`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller holds the key now.
    Acquired(Lease),
    /// The caller holds the key now, taken over from a holder whose lease ran out (that
    /// holder's token is fenced off): a lease expiry, as operators count them.
    TookOver(Lease),
    /// Someone else holds it until `until_ms`.
    InFlight {
        /// When that lease runs out.
        until_ms: u64,
    },
    /// The key is done; here is its stored outcome.
    Done {
        /// What the first run stored.
        outcome: Option<Bytes>,
    },
    /// The key is held or done for another payload (its fingerprint differs); nothing changed.
    Conflict,
}

impl Claim {
    /// The lease granted, whether the key was free or taken over.
    pub fn lease(&self) -> Option<&Lease> {
        match self {
            Self::Acquired(lease) | Self::TookOver(lease) => Some(lease),
            _ => None,
        }
    }
}

/// The answer to `renew`, `complete` and `release`: a compare-and-set on the fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceCheck {
    /// The token was current; the change was made.
    Accepted,
    /// The token is not the record's current one (the lease was re-granted, completed or
    /// expired and forgotten); nothing changed.
    Rejected,
}

/// Where an admitted event sits in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QueueId {
    /// The partition.
    pub partition: u16,
    /// The position inside the partition, increasing.
    pub seq: u64,
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.partition, self.seq)
    }
}

/// The answer to `admit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// New: every key was marked seen and the event was queued at `id`.
    Admitted {
        /// The queue position.
        id: QueueId,
    },
    /// Key number `key_index` of the call was seen within retention; nothing changed.
    Duplicate {
        /// Which of the given keys was already seen.
        key_index: usize,
    },
    /// The request's nonce was handled within its window (`admit_with_nonce` only): a replay;
    /// nothing changed.
    Replayed,
}

/// A signed request's nonce, checked and remembered together with its admission so that every
/// gateway sharing the store refuses a replay. The outage spool keeps it as serialized here:
/// fields are added at the end, never reordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nonce {
    /// The nonce, hashed with its source.
    pub key: KeyHash,
    /// How long it must be remembered: while its timestamp still passes the skew check.
    pub window_ms: u64,
    /// The request's signed timestamp, unix seconds: a replay carries the same one, so a store
    /// may file the nonce under it and look in one place.
    pub timestamp_secs: u64,
}

/// An event handed out of the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Its queue position; ack, retry or dead-letter by it.
    pub id: QueueId,
    /// The key to claim before handling it (the first dedup key given to `admit`).
    pub key: KeyHash,
    /// The event.
    pub event: Event,
    /// How many times it was handed out before this one.
    pub attempt: u32,
}

/// An event that will not be retried, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Its former queue position.
    pub id: QueueId,
    /// Its claim key.
    pub key: KeyHash,
    /// The event.
    pub event: Event,
    /// Attempts made.
    pub attempts: u32,
    /// Why it was given up.
    pub reason: String,
    /// When, unix ms.
    pub at_ms: u64,
}

/// The answer to a watermark advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatermarkOutcome {
    /// The value is not older than the mark; the mark is now the larger of the two.
    Accepted {
        /// The mark before, if there was one.
        previous: Option<u64>,
    },
    /// The value is older than the mark; nothing changed.
    Stale {
        /// The current mark.
        current: u64,
    },
}

/// Counts for operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStats {
    /// Live records in `Pending`.
    pub pending: u64,
    /// Live records in `Processing`.
    pub processing: u64,
    /// Live records in `Completed`.
    pub completed: u64,
    /// Events in the queue, including handed-out ones not yet acked.
    pub queued: u64,
    /// Events handed out and not yet acked.
    pub in_flight: u64,
    /// Dead letters kept.
    pub dead_letters: u64,
    /// Records dropped before their retention ended because a size bound was reached.
    pub evicted_early: u64,
}

/// One partition's queue at a glance, for gauges and operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSummary {
    /// The partition.
    pub partition: u16,
    /// Events queued, handed-out ones included.
    pub events: u64,
    /// Events handed out and not yet acked.
    pub handed_out: u64,
    /// What the queued events take: their payloads' bytes in a gateway's own store, the
    /// stream's memory on a Redis server.
    pub bytes: u64,
    /// When the platform created the partition's oldest queued event, unix ms; `None` when the
    /// partition is empty.
    pub oldest_created_ms: Option<u64>,
}

/// Who hands out one partition's events, on a store that several gateways share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionOwner {
    /// The partition.
    pub partition: u16,
    /// The owning gateway's name in the store; `None` while nobody owns it (between a release
    /// and the next take, or after an owner's ownership ran out).
    pub gateway: Option<String>,
    /// The epoch of the owner's grant: it grows with every grant of the partition.
    pub epoch: u64,
    /// The owner is the gateway asked.
    pub here: bool,
    /// The gateway asked is handing it over: it hands out nothing new there and releases it
    /// once its running handlers are done.
    pub handing_over: bool,
}

/// Where one queued event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum QueuedState {
    /// Waiting to be handed out (now, or after an earlier event of its order key).
    Waiting,
    /// Waiting for a retry's backoff to end.
    Delayed {
        /// Not handed out before this time, unix ms.
        until_ms: u64,
    },
    /// Handed out and not yet acked.
    HandedOut,
}

/// One event in a partition's queue, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedEvent {
    /// Its queue position.
    pub id: QueueId,
    /// Its claim key.
    pub key: KeyHash,
    /// The event.
    pub event: Event,
    /// How many times it was handed out before.
    pub attempt: u32,
    /// Where it stands.
    pub state: QueuedState,
}
