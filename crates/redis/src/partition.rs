//! One partition as a store instance holds it: the queue's order index, ownership and its
//! epoch, and the bodies and lean leases of what it handed out.

use std::time::Duration;

use oncegate_core::queue_index::PartitionIndex;
use oncegate_core::{Delivery, FencingToken, KeyHash, Lease, QueueId, StoreError};

use crate::Stored;
use crate::reply::decode;

#[derive(Default)]
pub(crate) struct Partition {
    pub(crate) order: PartitionIndex,
    /// The largest entry folded into `order`: entries come in id order, so anything at or
    /// below it is known (or was acked).
    pub(crate) last_seq: u64,
    /// This instance owns the partition, as far as it knows.
    pub(crate) owned: bool,
    /// The epoch of this instance's grant (0 when it owns nothing): every owner's call names it.
    pub(crate) epoch: u64,
    /// Since when the partition is being handed over: nothing new is handed out, and ownership
    /// is given up once no handed-out event is left.
    pub(crate) draining: Option<std::time::Instant>,
    /// When the renewal that last found the partition ours was sent: the ownership lives for
    /// the ownership time after Redis ran it, so until that has passed it is ours.
    pub(crate) renewed: Option<std::time::Instant>,
    /// Newly owned: the group's pending entries of earlier owners are still to be taken over.
    pub(crate) reclaim: bool,
    /// A group read may have been applied by Redis without its answer reaching us (entries
    /// then sit in this consumer's pending list, unknown here): read that list back before
    /// anything newer.
    pub(crate) resync: bool,
    /// When the stream was last read for new entries.
    pub(crate) read: Option<std::time::Instant>,
    /// When the pending list was last read back; it is, every `RESYNC_EVERY`, whatever
    /// happened, so that an answer lost without an error is caught too.
    pub(crate) resynced: Option<std::time::Instant>,
    /// Payloads of entries this owner's group read brought and that are not handed out yet,
    /// so that the hand-out need not read them again (up to `BODIES_BYTES`; the others are
    /// read at hand-out).
    pub(crate) bodies: std::collections::HashMap<u64, Body>,
    /// The bytes `bodies` holds.
    pub(crate) body_bytes: usize,
    /// Events handed out lean (no claim written) and not yet made claims of their own, by
    /// entry: one still running `ownership / 2` after its hand-out takes a claim at the next
    /// balancing round, every one when the partition is handed over (`share`).
    pub(crate) lean: std::collections::HashMap<u64, LeanOut>,
    /// Entries taken over from an owner whose ownership ran out wait until then (this store's
    /// clock, ms): that owner may still be running those it handed out lean.
    pub(crate) hold_until_ms: u64,
    /// Each tenant's events as last published (`groups.rs`), and when.
    pub(crate) published: std::collections::HashMap<u64, u64>,
    pub(crate) published_at: Option<std::time::Instant>,
}

/// A lean hand-out: the lease the dispatcher holds, and when it was handed out.
pub(crate) struct LeanOut {
    pub(crate) lease: Lease,
    pub(crate) lease_ms: u64,
    pub(crate) at: std::time::Instant,
}

/// Marks the token of a lean hand-out, whose low bits are the partition's epoch: a token no
/// claim gives out (claims' tokens are microseconds, far below it), so that every call knows
/// a lean lease from a claimed one by its token alone.
pub(crate) const LEAN: u64 = 1 << 62;

/// The epoch a lean lease was handed out under; `None` for a claimed lease.
pub(crate) fn lean_epoch(token: FencingToken) -> Option<u64> {
    (token.0 & LEAN != 0).then_some(token.0 & !LEAN)
}

/// A queue entry's payload kept from the read that brought it.
pub(crate) struct Body {
    pub(crate) key: KeyHash,
    pub(crate) stored: Vec<u8>,
    pub(crate) attempt: u32,
}

/// Payload bytes a partition keeps between reading its entries and handing them out.
pub(crate) const BODIES_BYTES: usize = 4 * 1024 * 1024;

impl Partition {
    pub(crate) fn forget(&mut self) {
        *self = Self::default();
    }

    /// Whether this instance may hand out the partition's events now: it owns it, is not
    /// handing it over, and its last renewal cannot have run out (`ownership` after it was
    /// sent; every owner's call is fenced by the epoch in Redis anyway).
    pub(crate) fn serving(&self, ownership: Duration) -> bool {
        self.owned
            && self.draining.is_none()
            && self.renewed.is_some_and(|at| at.elapsed() < ownership)
    }

    pub(crate) fn keep_body(&mut self, seq: u64, key: KeyHash, stored: Vec<u8>, attempt: u32) {
        if self.body_bytes + stored.len() <= BODIES_BYTES {
            self.body_bytes += stored.len();
            self.bodies.insert(
                seq,
                Body {
                    key,
                    stored,
                    attempt,
                },
            );
        }
    }

    /// The kept payload of `seq`, as a delivery, once: `None` when it was not kept.
    pub(crate) fn take_body(
        &mut self,
        partition: u16,
        seq: u64,
    ) -> Option<Result<Delivery, StoreError>> {
        let body = self.bodies.remove(&seq)?;
        self.body_bytes -= body.stored.len();
        Some(delivery_of(
            QueueId { partition, seq },
            body.key,
            &body.stored,
            body.attempt,
        ))
    }
}

/// A queue entry's delivery, from its payload as the stream stores it.
pub(crate) fn delivery_of(
    id: QueueId,
    key: KeyHash,
    stored: &[u8],
    attempt: u32,
) -> Result<Delivery, StoreError> {
    let stored: Stored = decode(stored)?;
    Ok(Delivery {
        id,
        key,
        event: stored.event,
        attempt,
    })
}
