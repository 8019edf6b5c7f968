//! The seam to durability: every change the store makes is handed to its [`Journal`] inside the
//! critical section that makes it, and no answer leaves the store before the journal has made
//! everything the answer saw durable — except answers that only grant, extend or end a lease
//! (a crash ends every lease anyway: the run after it fences every earlier token), and the
//! dispatcher's complete-and-ack: the journal keeps order, so that completion is durable once
//! anything after it is, and a crash before then runs its handler once more, as it does for a
//! handler running at the crash.
//!
//! A change states its subject's new value outright (a record, a queue entry, a mark), never a
//! delta, so replaying a suffix of the journal over any later state of the same subjects ends in
//! the same state: a snapshot may be taken while the store runs.

use std::borrow::Cow;
use std::future::Future;

use oncegate_core::{DeadLetter, Event, KeyHash, QueueId, Record, StoreError};
use serde::{Deserialize, Serialize};

/// One change to the store's state, borrowed when it is journaled and owned when it is replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Change<'a> {
    /// A record's new value (its identity in its partition: `KeyHash::in_partition`).
    Record {
        /// The record's identity.
        key: KeyHash,
        /// Its value.
        record: Cow<'a, Record>,
    },
    /// An admitted event: every key marked with `record`, the event queued as `id`.
    Admit {
        /// The records' identities.
        keys: Cow<'a, [KeyHash]>,
        /// The record each key now holds.
        record: Cow<'a, Record>,
        /// Where the event is queued.
        id: QueueId,
        /// The key handed out with the event (the caller's first key).
        primary: KeyHash,
        /// The event's order hash.
        order_hash: u64,
        /// The event.
        event: Cow<'a, Event>,
    },
    /// A queue entry as a snapshot holds it.
    Queued {
        /// Its place.
        id: QueueId,
        /// The key handed out with it.
        key: KeyHash,
        /// Its order hash.
        order_hash: u64,
        /// Attempts so far.
        attempt: u32,
        /// Not handed out before this time.
        not_before_ms: u64,
        /// The event.
        event: Cow<'a, Event>,
    },
    /// A handled entry left the queue.
    Ack {
        /// The entry.
        id: QueueId,
    },
    /// An entry goes out again at `not_before_ms`.
    Retry {
        /// The entry.
        id: QueueId,
        /// Attempts so far.
        attempt: u32,
        /// Not handed out before this time.
        not_before_ms: u64,
    },
    /// An entry moved to the dead letters.
    Dead {
        /// The letter, under the entry's id.
        letter: Cow<'a, DeadLetter>,
    },
    /// Dead letter `from` went back to the queue as `to`, with all it needs: a snapshot taken
    /// meanwhile may hold neither the letter nor the entry.
    Revived {
        /// The letter.
        from: QueueId,
        /// Its new place in the queue.
        to: QueueId,
        /// The key handed out with it.
        key: KeyHash,
        /// Its order hash.
        order_hash: u64,
        /// The event.
        event: Cow<'a, Event>,
    },
    /// Dead letter `id` was removed for good.
    Purged {
        /// The letter.
        id: QueueId,
    },
    /// A watermark's value and when it may be forgotten.
    Mark {
        /// The scope.
        scope: KeyHash,
        /// The mark.
        value: u64,
        /// Its deadline, unix ms.
        deadline_ms: u64,
    },
    /// The next seq a partition gives out (snapshots: acked entries leave no trace otherwise).
    NextSeq {
        /// The partition.
        partition: u16,
        /// Its next seq.
        next: u64,
    },
    /// A shared value written (`value`) or removed (`None`), and its namespace's generation
    /// after the change (a written value's version). An empty `name` only carries the
    /// generation (snapshots: removals leave no trace otherwise).
    State {
        /// The namespace.
        namespace: Cow<'a, str>,
        /// The name.
        name: Cow<'a, str>,
        /// The value written, or `None`: removed.
        value: Option<bytes::Bytes>,
        /// The namespace's generation after the change.
        version: u64,
        /// When the value expires, unix ms; 0: never.
        expires_at_ms: u64,
    },
}

/// Where a store's changes go to become durable.
pub trait Journal: Send + Sync + 'static {
    /// Refuses when the journal can take no more (it failed): checked before a change is made,
    /// so that a refused call changes nothing.
    fn check(&self) -> Result<(), StoreError>;

    /// Appends `change`; called inside the critical section that made it, so the journal's
    /// order is the order in which the changes happened to each subject.
    fn append(&self, change: &Change<'_>);

    /// Completes once everything appended before this call is durable.
    fn sync(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// What the journal keeps: by default nothing beyond the process.
    fn durability(&self) -> oncegate_core::Durability {
        oncegate_core::Durability::in_process()
    }
}

/// No journal: the store lives in memory only.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJournal;

impl Journal for NoJournal {
    #[inline]
    fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }

    #[inline]
    fn append(&self, _: &Change<'_>) {}

    #[inline]
    fn sync(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}
